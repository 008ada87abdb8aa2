use clap::Parser;

// The decision allocates small, short-lived objects; mimalloc cuts its cost by a third
// (benches/engine.rs).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    evi::cli::run(evi::cli::Cli::parse())
}
