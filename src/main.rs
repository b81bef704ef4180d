#![forbid(unsafe_code)]

/// A review is mostly small allocations (parsing a pod, building its patch): mimalloc does
/// them in a fraction of glibc's time. See benches/README.md.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    std::process::exit(tollgate::cli::main());
}
