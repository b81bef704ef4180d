// Unsafe code only in `return_freed_memory_at_once`: one call into mimalloc's C interface.
#![deny(unsafe_code)]

/// A review is mostly small allocations (parsing a pod, building its patch): mimalloc does
/// them in a fraction of glibc's time. See benches/README.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Public for `kubectl-tollgate` (src/bin/kubectl-tollgate.rs), which is this program.
pub fn main() {
    return_freed_memory_at_once();
    let code = tollgate::cli::main();
    // Review log lines are batched; `exit` would not wait for them.
    tollgate::telemetry::flush();
    std::process::exit(code);
}

/// mimalloc's C interface (`mimalloc.h`), in the static library the `mimalloc` crate links.
/// The crate offers no safe way to set an option, and reads them only from the environment
/// (at load, before `main`), so the option is set here.
mod mi {
    use std::ffi::{c_int, c_long};

    extern "C" {
        pub fn mi_option_set(option: c_int, value: c_long);
    }

    /// `mi_option_purge_delay` in `mi_option_t`: mimalloc keeps the enum's numbering as its
    /// ABI (retired options keep their place), 15 since the option was `reset_delay`.
    pub const OPTION_PURGE_DELAY: c_int = 15;
}

/// Memory freed is given back to the system at once (`purge_delay` 0), not a second later
/// and only when the thread that freed it allocates again (mimalloc's default): the
/// cluster context's first lists pass tens of MB through worker threads that then go
/// quiet, and would keep them resident. Measured: it adds no system call to a review
/// (docs/operations.md, "Memory"). Set in code so that the binary, the image and the chart
/// behave alike; `MIMALLOC_PURGE_DELAY` in the environment still wins.
fn return_freed_memory_at_once() {
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_some() {
        return;
    }
    // SAFETY: `mi_option_set` only stores the value in mimalloc's table of options (and
    // marks it set); it is called before any thread is spawned, and mimalloc reads the
    // option when it next decides whether to purge.
    #[allow(unsafe_code)]
    unsafe {
        mi::mi_option_set(mi::OPTION_PURGE_DELAY, 0)
    };
}
