//! What the cluster context's node summaries cost: the nodes of a GPU cluster
//! (tests/support/gpu_nodes.rs, as the GPU Operator labels them), listed in pages of 500 as
//! the apiserver sends them, turned into the summaries reviews read, as the server's node
//! cache does. Reports, for 5,000 and 50,000 nodes (`TOLLGATE_BENCH_NODE_COUNTS=5000,50000`):
//! the bytes the summaries hold per node once built, the most the heap held above that
//! while building them, the shapes, and the time.
//!
//! ```text
//! cargo bench --bench nodes
//! ```
//!
//! Bytes are counted by a global allocator that wraps the server's (mimalloc) and counts
//! what is allocated and not yet freed: the heap the summaries take, not what the allocator
//! keeps of it. See benches/README.md.

use std::alloc::{GlobalAlloc, Layout};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde_json::{json, Value};

#[path = "../tests/support/gpu_nodes.rs"]
mod gpu_nodes;

/// mimalloc, counting live and peak bytes.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { mimalloc::MiMalloc.alloc(layout) };
        if !p.is_null() {
            let now = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as is.
        unsafe { mimalloc::MiMalloc.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as is.
        let p = unsafe { mimalloc::MiMalloc.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
            let now = LIVE.fetch_add(new_size, Ordering::Relaxed) + new_size;
            PEAK.fetch_max(now, Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Nodes per page: what the cluster context asks for.
const PAGE: usize = 500;

/// The nodes as the apiserver lists them: pages of 500 as JSON text, each node with the
/// managedFields the apiserver adds (the kubelet's, as it writes node and status).
fn pages(n: usize, timestamps: bool) -> Vec<Vec<u8>> {
    let managed = json!([
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
         "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1",
         "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:alpha.kubernetes.io/provided-node-ip": {},
            "f:node.alpha.kubernetes.io/ttl": {}, "f:volumes.kubernetes.io/controller-managed-attach-detach": {}},
            "f:labels": {".": {}, "f:kubernetes.io/hostname": {}, "f:kubernetes.io/os": {}}},
            "f:spec": {"f:providerID": {}}}},
        {"manager": "kubelet", "operation": "Update", "apiVersion": "v1",
         "time": "2026-01-01T00:00:00Z", "fieldsType": "FieldsV1", "subresource": "status",
         "fieldsV1": {"f:status": {"f:allocatable": {"f:cpu": {}, "f:memory": {}, "f:nvidia.com/gpu": {}},
            "f:capacity": {"f:cpu": {}, "f:memory": {}}, "f:conditions": {}, "f:images": {}, "f:nodeInfo": {}}}}
    ]);
    (0..n)
        .collect::<Vec<_>>()
        .chunks(PAGE)
        .enumerate()
        .map(|(p, chunk)| {
            let items: Vec<Value> = chunk
                .iter()
                .map(|&i| {
                    let mut node = gpu_nodes::gpu_node(i);
                    if !timestamps {
                        let labels = node["metadata"]["labels"].as_object_mut().unwrap();
                        labels.remove("nvidia.com/gfd.timestamp");
                    }
                    node["metadata"]["managedFields"] = managed.clone();
                    node["metadata"]["uid"] = json!(format!("{i:08x}-0000-4000-8000-000000000000"));
                    node["metadata"]["resourceVersion"] = json!((1000 + i).to_string());
                    node["metadata"]["creationTimestamp"] = json!("2026-01-01T00:00:00Z");
                    node.as_object_mut().unwrap().remove("apiVersion");
                    node.as_object_mut().unwrap().remove("kind");
                    node
                })
                .collect();
            let last = (p + 1) * PAGE >= n;
            serde_json::to_vec(&json!({
                "kind": "NodeList", "apiVersion": "v1",
                "metadata": {"resourceVersion": "99999",
                    "continue": if last { String::new() } else { format!("token-{p}") }},
                "items": items
            }))
            .unwrap()
        })
        .collect()
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken.
    let counts: Vec<usize> = std::env::var("TOLLGATE_BENCH_NODE_COUNTS")
        .unwrap_or_else(|_| "5000,50000".into())
        .split(',')
        .filter_map(|c| c.trim().parse().ok())
        .collect();
    println!(
        "| nodes | GFD timestamp | JSON listed | summaries held | per node | peak above the start | shapes | build |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |");
    for n in counts {
        // With GPU Feature Discovery's per-node timestamp (its default), and without it
        // (`--no-timestamp`), where nothing but the hostname tells a pool's nodes apart.
        for timestamps in [true, false] {
            let pages = pages(n, timestamps);
            let listed: usize = pages.iter().map(Vec::len).sum();
            let before = LIVE.load(Ordering::Relaxed);
            PEAK.store(before, Ordering::Relaxed);
            let started = Instant::now();
            let summaries = summarize(&pages);
            let took = started.elapsed();
            let held = LIVE.load(Ordering::Relaxed) - before;
            let peak = PEAK.load(Ordering::Relaxed) - before;
            println!(
                "| {n} | {} | {:.1} MiB | {:.2} MiB | {} B | {:.1} MiB | {} | {:.0?} |",
                if timestamps { "yes" } else { "no" },
                listed as f64 / 1048576.0,
                held as f64 / 1048576.0,
                held / n,
                peak as f64 / 1048576.0,
                summaries.1,
                took
            );
            drop(summaries);
        }
    }
}

/// What the server's node cache holds once the pages are in: its index and the snapshot
/// reviews read (kept together, as the cache keeps them); and the snapshot's shapes. Each
/// page is read as the cache reads it (`cluster::pages`): in chunks of 16 KB as they come
/// off the connection, each node parsed and taken in as soon as its last byte is read.
fn summarize(pages: &[Vec<u8>]) -> (impl Sized, usize) {
    use tollgate::cluster::nodes::{NodeView, ShapeIndex};
    use tollgate::cluster::pages::{SplitError, Splitter};
    let mut index = ShapeIndex::default();
    for page in pages {
        let mut splitter = Splitter::default();
        for chunk in page.chunks(16 * 1024) {
            // A copy, as the body's chunks are the connection's, not the list's.
            let chunk = chunk.to_vec();
            splitter
                .feed(&chunk, |item| {
                    let node: NodeView = serde_json::from_slice(item).expect("a node");
                    index.apply(&node.0);
                    Ok::<(), SplitError>(())
                })
                .expect("a list");
        }
        splitter.finish().expect("a whole list");
    }
    let snapshot = index.snapshot();
    let shapes = snapshot.shapes.len();
    ((index, snapshot), shapes)
}
