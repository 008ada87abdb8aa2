use clap::Parser;

fn main() -> std::process::ExitCode {
    evi::cli::run(evi::cli::Cli::parse())
}
