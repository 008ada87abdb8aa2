use clap::Parser;

// The decision allocates small, short-lived objects; mimalloc cuts its cost by a third
// (benches/engine.rs). Deployments set MIMALLOC_ARENA_EAGER_COMMIT=0 so idle memory stays small.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    evi::cli::run(evi::cli::Cli::parse())
}
