#![forbid(unsafe_code)]

fn main() {
    std::process::exit(tollgate::cli::main());
}
