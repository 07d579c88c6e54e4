//! The `zgix` binary: parses the command line and hands over to [`zgix::server`].
fn main() {
    std::process::exit(zgix::cli::main());
}
