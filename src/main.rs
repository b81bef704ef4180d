#![forbid(unsafe_code)]

/// A review is mostly small allocations (parsing a pod, building its patch): mimalloc does
/// them in a fraction of glibc's time. See benches/README.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let code = tollgate::cli::main();
    // Review log lines are batched; `exit` would not wait for them.
    tollgate::telemetry::flush();
    std::process::exit(code);
}
