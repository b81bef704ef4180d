//! `kubectl tollgate`: the `tollgate` program under the name kubectl looks for on PATH
//! (`kubectl-tollgate`), so that every command is a kubectl plugin command as well:
//! `kubectl tollgate why pod/x -n ml`. It is src/main.rs itself (its allocator, its
//! exit), which reads the name it was run as (`cli::main`): help and usage say
//! `kubectl tollgate`.

#[path = "../main.rs"]
mod program;

fn main() {
    program::main();
}
