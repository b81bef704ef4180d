//! Runtime cost: what evaluating the policy spends on a given request.
//!
//! cel-go counts cost while it evaluates (`interpreter/runtimecost.go`, `CostTracker`, over
//! the plan of `interpreter/planner.go`): 1 for each identifier and each field selection or
//! index (`common.SelectAndIdentCost`; an attribute and each of its qualifiers), 1 more for
//! selecting from or indexing what is not itself an attribute (a call's result: the planner
//! wraps it in a relative attribute, observed on its own), 0 for the final selection of a
//! `has()` (Kubernetes sets `PresenceTestHasCost(false)`), 0 for constants, 10 for a list
//! literal and 30 for a map literal (`ListCreateBaseCost`, `MapCreateBaseCost`), nothing
//! for `&&`, `||` and `?:` themselves (only for the operands they evaluate), and for every
//! other call what the Kubernetes estimator (`library/cost.go` `CallCost`) says, else
//! cel-go's default: string traversals at a tenth of a unit per character
//! (`StringTraversalCostFactor`), list membership the list's size, `matches` the string's
//! traversal times a quarter of the pattern's length, and 1 for the rest. A comprehension
//! costs its range, its initial accumulator, each iteration's condition and step, and its
//! result, as its parts are evaluated. Kubernetes evaluates with `cel.OptOptimize`
//! (base.go), whose plan folds a list or map literal of constants into a constant (0, `[]`
//! included) and `x in [constants]` into a set lookup (0 beyond `x`): counted so here.

use kube_cel::cel::common::ast::{EntryExpr, Expr, IdedExpr};

use crate::value::Val;

fn ceil_cost(x: f64) -> u64 {
    x.ceil() as u64
}

/// library/cost.go `traversalCost`: a tenth per byte of each string, summed over lists
/// and maps, truncated.
fn traversal_cost(v: &Val) -> u64 {
    match v {
        Val::Str(s) => (s.len() as f64 * 0.1) as u64,
        Val::Bytes(b) => (b.len() as f64 * 0.1) as u64,
        Val::List(l) => l.iter().map(traversal_cost).sum(),
        Val::Map(m) => m
            .iter()
            .map(|(k, v)| (k.len() as f64 * 0.1) as u64 + traversal_cost(v))
            .sum(),
        _ => 1,
    }
}

/// The cost of one call, from its (receiver first) arguments and result: library/cost.go
/// `CallCost` first, then runtimecost.go's `costCall` defaults.
pub(crate) fn call_cost(name: &str, member: bool, args: &[Val], result: &Val) -> u64 {
    let size = |i: usize| args.get(i).map_or(1, Val::size) as f64;
    let is_str = |i: usize| matches!(args.get(i), Some(Val::Str(_) | Val::Bytes(_)));
    match name {
        // library/cost.go.
        "isSorted" | "sum" | "max" | "min" | "indexOf" | "lastIndexOf" | "includes" => {
            args.first().map_or(0, traversal_cost)
        }
        "url" | "lowerAscii" | "upperAscii" | "substring" | "trim" => ceil_cost(size(0) * 0.1),
        "replace" | "split" => ceil_cost(size(0) * 2.0 * 0.1),
        "join" => ceil_cost(result.size() as f64 * 2.0 * 0.1),
        "find" | "findAll" => ceil_cost((1.0 + size(0)) * 0.1) * ceil_cost(size(1) * 0.25),
        "quantity" | "isQuantity" | "semver" | "isSemver" | "cidr" | "isIP" | "isCIDR" => {
            ceil_cost(size(0) * 0.1)
        }
        // runtimecost.go defaults, by overload.
        "startsWith" | "endsWith" => ceil_cost(size(0) * 0.1),
        "bytes" if matches!(args.first(), Some(Val::Str(_))) => ceil_cost(size(0) * 0.1),
        "string" if matches!(args.first(), Some(Val::Bytes(_))) => ceil_cost(size(0) * 0.1),
        "@in" if matches!(args.get(1), Some(Val::List(_))) => size(1) as u64,
        "_==_" | "_!=_" | "_<_" | "_<=_" | "_>_" | "_>=_" => {
            let relation = !matches!(name, "_==_" | "_!=_");
            if relation && !(is_str(0) && is_str(1)) {
                1
            } else {
                ceil_cost(size(0).min(size(1)) * 0.1)
            }
        }
        "_+_" if is_str(0) && is_str(1) => ceil_cost((size(0) + size(1)) * 0.1),
        // The member overload is `matches_string`; the global one's id is plain
        // `matches`, which costCall does not name, so it costs 1.
        "matches" if member => ceil_cost((1.0 + size(0)) * 0.1) * ceil_cost(size(1) * 0.25),
        "contains" => ceil_cost(size(0) * 0.1) * ceil_cost(size(1) * 0.1),
        _ => 1,
    }
}

/// Whether the planner makes `e` an attribute (identifiers, selections, indexes and
/// conditionals), which a further selection or index extends at no cost of its own.
pub(crate) fn is_attribute(e: &IdedExpr) -> bool {
    match &e.expr {
        Expr::Ident(_) | Expr::Select(_) => true,
        Expr::Call(c) => c.target.is_none() && matches!(c.func_name.as_str(), "_[_]" | "_?_:_"),
        _ => false,
    }
}

/// Whether `cel.OptOptimize` folds `e` into a constant: a literal, or a list or map literal
/// of them (`maybeBuildListLiteral`, `maybeBuildMapLiteral`).
pub(crate) fn is_constant(e: &IdedExpr) -> bool {
    match &e.expr {
        Expr::Literal(_) => true,
        Expr::List(l) => l.optional_indices.is_empty() && l.elements.iter().all(is_constant),
        Expr::Map(m) => m.entries.iter().all(|en| match &en.expr {
            EntryExpr::MapEntry(me) => {
                !me.optional && is_constant(&me.key) && is_constant(&me.value)
            }
            EntryExpr::StructField(_) => false,
        }),
        _ => false,
    }
}
