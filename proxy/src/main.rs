//! The `zgix` binary: parses the command line and hands over to [`zgix::process::server`].
#[global_allocator]
static ALLOCATOR: zgix::observe::alloc::Counting = zgix::observe::alloc::Counting;

fn main() {
    // A panic in any shard ends the process (as `panic = "abort"` does in
    // release builds): a half-dead proxy that accepts and never answers is
    // worse than a restart by the supervisor.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default_hook(info);
        std::process::abort();
    }));
    std::process::exit(zgix::process::cli::main());
}
