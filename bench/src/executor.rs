//! Starting pinned glommio executors on their own threads, with a useful error
//! when io_uring cannot get locked memory.

use glommio::{LocalExecutorBuilder, Placement};
use std::future::Future;
use std::sync::mpsc;
use std::thread::JoinHandle;

/// io_uring memory per executor. glommio registers (and so locks) this buffer
/// for fixed-buffer I/O; sockets do not use it, so it stays small. 512 KiB times
/// a few executors stays under the 8 MiB default `ulimit -l` with room for the
/// rings themselves.
pub const IO_MEMORY: usize = 512 << 10;

/// Spawns a thread running a glommio executor pinned to `cpu` (or unpinned when
/// `None`) and runs `make()`'s future on it. Returns once the executor exists,
/// so a failure to create it is reported here rather than as a panic.
pub fn spawn<G, F, T>(name: &str, cpu: Option<usize>, make: G) -> Result<Handle<T>, String>
where
    G: FnOnce() -> F + Send + 'static,
    F: Future<Output = T> + 'static,
    T: Send + 'static,
{
    let (tx, rx) = mpsc::channel::<Result<(), String>>();
    let thread_name = name.to_string();
    let handle = std::thread::Builder::new()
        .name(thread_name.clone())
        .spawn(move || {
            let placement = cpu.map_or(Placement::Unbound, Placement::Fixed);
            let ex = match LocalExecutorBuilder::new(placement)
                .name(&thread_name)
                .io_memory(IO_MEMORY)
                .make()
            {
                Ok(ex) => {
                    let _ = tx.send(Ok(()));
                    ex
                }
                Err(e) => {
                    let _ = tx.send(Err(executor_error(cpu, &e.to_string())));
                    return None;
                }
            };
            Some(ex.run(make()))
        })
        .map_err(|e| format!("cannot spawn thread {name}: {e}"))?;
    match rx.recv() {
        Ok(Ok(())) => Ok(Handle(handle)),
        Ok(Err(e)) => {
            let _ = handle.join();
            Err(e)
        }
        Err(_) => Err(format!("executor thread {name} died while starting")),
    }
}

/// A started executor thread; [`Handle::join`] waits for its future's output.
pub struct Handle<T>(JoinHandle<Option<T>>);

impl<T> Handle<T> {
    /// Waits for the executor's future to finish and returns its output.
    /// Re-raises a panic from the executor thread.
    pub fn join(self) -> T {
        match self.0.join() {
            // The thread returns None only when the executor never started,
            // and `spawn` has already reported that as an error.
            Ok(v) => v.expect("executor started"),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
}

fn executor_error(cpu: Option<usize>, err: &str) -> String {
    let where_ = cpu.map_or_else(|| "unpinned".to_string(), |c| format!("on CPU {c}"));
    if err.contains("doesn't exist") {
        return format!("cannot create glommio executor {where_}: {err}");
    }
    format!(
        "cannot create glommio executor {where_}: {err}\n\
         io_uring needs locked memory; the likely cause is the memlock limit \
         (check `ulimit -l`; raise it with `ulimit -l unlimited`, LimitMEMLOCK=infinity \
         in a systemd unit, or `* - memlock unlimited` in /etc/security/limits.conf)"
    )
}
