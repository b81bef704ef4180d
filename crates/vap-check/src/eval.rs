//! The evaluator of the cost count: a policy run on one request as validator.go runs it.
//!
//! This evaluator computes the values so that sizes are real (a message's concatenations
//! cost what its strings' lengths say) and counts by the rules of the `cost` module. It is
//! not cel-go's tracker: it walks the expression rather than cel-go's plan, so where the
//! plan differs in ways not named there the counts may differ by a little; the limits it
//! is held to are two orders of magnitude above what the export spends. It evaluates the
//! functions the export uses; any other call is reported as not evaluable rather than
//! guessed.
//!
//! The apiserver evaluates each variable lazily, once per filter (`composition.go`: a
//! variable's own evaluation is charged to the filter, not to the expression that reads
//! it), so the per-expression figures below are each expression's own cost and the filter
//! totals add the variables it caused to be evaluated.

use std::collections::{BTreeMap, HashMap};
use std::rc::Rc;

use kube_cel::cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr, LiteralValue};
use serde_json::Value;

use crate::checker::{compiled, qualified_name};
use crate::compile::parse;
use crate::cost::{call_cost, is_attribute, is_constant};
use crate::functions::Library;
use crate::limits::{PER_CALL_LIMIT, RUNTIME_CEL_COST_BUDGET};
use crate::policy::{list_at, str_at};
use crate::value::{cel_eq, num, Val};

/// A request for the cost count: the admission variables' values.
#[derive(Debug, Clone)]
pub struct Input {
    pub object: Val,
    pub request: Val,
    pub namespace_object: Val,
}

impl Input {
    pub fn new(object: &Value, request: &Value, namespace_object: &Value) -> Input {
        Input {
            object: Val::from_json(object),
            request: Val::from_json(request),
            namespace_object: Val::from_json(namespace_object),
        }
    }
}

/// What one evaluation of the policy on one request spent and gave.
#[derive(Debug, Default)]
pub struct Run {
    /// Each expression's own cost (variables at their path, once per filter that
    /// evaluated them, the largest kept): what `PER_CALL_LIMIT` bounds.
    pub costs: BTreeMap<String, u64>,
    /// The three filters' totals, variables included.
    pub validations: u64,
    pub messages: u64,
    pub audit: u64,
    /// Whether every validation held.
    pub allowed: bool,
    /// Each messageExpression's result length in bytes (trimmed), when it gave a string.
    pub message_bytes: Vec<usize>,
    /// The variables the validations caused to be evaluated, by name.
    pub variables: BTreeMap<String, Val>,
    /// CEL runtime errors, by expression: with failurePolicy Fail, the request is refused.
    pub errors: Vec<String>,
}

/// Limits a run breaks, worded for a test failure.
pub fn limit_violations(run: &Run) -> Vec<String> {
    let mut out = vec![];
    for (path, cost) in &run.costs {
        if *cost > PER_CALL_LIMIT {
            out.push(format!(
                "{path}: cost {cost} over the per-expression limit {PER_CALL_LIMIT}"
            ));
        }
    }
    if run.validations > RUNTIME_CEL_COST_BUDGET {
        out.push(format!(
            "validations: cost {} over the budget {RUNTIME_CEL_COST_BUDGET}",
            run.validations
        ));
    }
    if run.validations + run.messages > RUNTIME_CEL_COST_BUDGET {
        out.push(format!(
            "messageExpressions: cost {} over what the validations left of the budget ({})",
            run.messages,
            RUNTIME_CEL_COST_BUDGET.saturating_sub(run.validations)
        ));
    }
    if run.audit > RUNTIME_CEL_COST_BUDGET {
        out.push(format!(
            "auditAnnotations: cost {} over the budget {RUNTIME_CEL_COST_BUDGET}",
            run.audit
        ));
    }
    out
}

struct Ctx<'p> {
    lib: &'p Library,
    globals: HashMap<&'static str, Val>,
}

/// The variables of one filter: evaluated on first use, then kept.
struct Vars<'p> {
    ctx: &'p Ctx<'p>,
    defs: &'p [(String, String, Rc<IdedExpr>)],
    cache: HashMap<String, Val>,
    /// What the variables' evaluations cost the filter.
    composition: u64,
    costs: BTreeMap<String, u64>,
    errors: Vec<String>,
}

impl<'p> Vars<'p> {
    fn get(&mut self, name: &str) -> Result<Val, String> {
        if let Some(v) = self.cache.get(name) {
            return Ok(v.clone());
        }
        let defs = self.defs;
        let Some((_, path, ast)) = defs.iter().find(|(n, _, _)| n == name) else {
            return Ok(Val::err(format!("no such key: {name}")));
        };
        let ctx = self.ctx;
        let mut ev = Eval {
            ctx,
            vars: self,
            locals: vec![],
            cost: 0,
        };
        let v = ev.eval(ast)?;
        let cost = ev.cost;
        self.composition += cost;
        let slot = self.costs.entry(path.clone()).or_default();
        *slot = (*slot).max(cost);
        if let Val::Err(e) = &v {
            self.errors.push(format!("{path}: {e}"));
        }
        self.cache.insert(name.to_owned(), v.clone());
        Ok(v)
    }
}

struct Eval<'a, 'p> {
    ctx: &'p Ctx<'p>,
    vars: &'a mut Vars<'p>,
    locals: Vec<(String, Val)>,
    cost: u64,
}

impl Eval<'_, '_> {
    fn local(&self, name: &str) -> Option<Val> {
        self.locals
            .iter()
            .rev()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.clone())
    }

    fn eval(&mut self, e: &IdedExpr) -> Result<Val, String> {
        match &e.expr {
            Expr::Literal(l) => Ok(match l {
                LiteralValue::Boolean(b) => Val::Bool(*b.inner()),
                LiteralValue::Bytes(b) => Val::Bytes(b.inner().into()),
                LiteralValue::Double(d) => Val::Double(*d.inner()),
                LiteralValue::Int(i) => Val::Int(*i.inner()),
                LiteralValue::Null => Val::Null,
                LiteralValue::String(s) => Val::str(s.inner()),
                LiteralValue::UInt(u) => Val::Uint(*u.inner()),
            }),
            Expr::Ident(name) => {
                self.cost += 1;
                if let Some(v) = self.local(name) {
                    return Ok(v);
                }
                match self.ctx.globals.get(name.as_str()) {
                    Some(v) => Ok(v.clone()),
                    None => Err(format!("cannot evaluate identifier {name}")),
                }
            }
            Expr::Select(s) => {
                let variables = matches!(&s.operand.expr, Expr::Ident(n) if n == "variables")
                    && self.local("variables").is_none();
                if variables {
                    self.cost += if s.test { 1 } else { 2 };
                    if s.test {
                        let known = self.vars.defs.iter().any(|(n, _, _)| *n == s.field);
                        return Ok(Val::Bool(known));
                    }
                    return self.vars.get(&s.field);
                }
                let operand = self.eval(&s.operand)?;
                if !s.test {
                    self.cost += 1;
                }
                if !is_attribute(&s.operand) {
                    self.cost += 1;
                }
                Ok(match operand {
                    Val::Map(m) => {
                        let v = m.get(s.field.as_str());
                        match (s.test, v) {
                            (true, v) => Val::Bool(v.is_some()),
                            (false, Some(v)) => v.clone(),
                            (false, None) => Val::err(format!("no such key: {}", s.field)),
                        }
                    }
                    Val::Err(e) => Val::Err(e),
                    other => Val::err(format!("no such overload: {other:?}.{}", s.field)),
                })
            }
            Expr::Call(call) => self.call(call),
            Expr::List(l) => {
                if !l.optional_indices.is_empty() {
                    return Err("cannot evaluate optional list elements".into());
                }
                if !is_constant(e) {
                    self.cost += 10;
                }
                let mut out = Vec::with_capacity(l.elements.len());
                for x in &l.elements {
                    let v = self.eval(x)?;
                    if let Val::Err(_) = v {
                        return Ok(v);
                    }
                    out.push(v);
                }
                Ok(Val::List(Rc::new(out)))
            }
            Expr::Map(m) => {
                if !is_constant(e) {
                    self.cost += 30;
                }
                let mut out = BTreeMap::new();
                for entry in &m.entries {
                    let EntryExpr::MapEntry(me) = &entry.expr else {
                        return Err("cannot evaluate a struct field".into());
                    };
                    if me.optional {
                        return Err("cannot evaluate optional map entries".into());
                    }
                    let k = self.eval(&me.key)?;
                    let v = self.eval(&me.value)?;
                    let Val::Str(k) = k else {
                        return Err(
                            "cannot evaluate a map literal with other than string keys".into()
                        );
                    };
                    out.insert(k, v);
                }
                Ok(Val::Map(Rc::new(out)))
            }
            Expr::Comprehension(c) => {
                let range = self.eval(&c.iter_range)?;
                let mut accu = self.eval(&c.accu_init)?;
                let items: Vec<(Val, Val)> = match &range {
                    Val::List(l) => l
                        .iter()
                        .enumerate()
                        .map(|(i, v)| (Val::Int(i as i64), v.clone()))
                        .collect(),
                    Val::Map(m) => m
                        .iter()
                        .map(|(k, v)| (Val::Str(k.clone()), v.clone()))
                        .collect(),
                    Val::Err(_) => return Ok(range),
                    other => return Ok(Val::err(format!("cannot range over {other:?}"))),
                };
                for (first, second) in items {
                    self.locals.push((c.accu_var.clone(), accu.clone()));
                    match &c.iter_var2 {
                        Some(v2) => {
                            self.locals.push((c.iter_var.clone(), first));
                            self.locals.push((v2.clone(), second));
                        }
                        None => {
                            let one = if matches!(range, Val::Map(_)) {
                                first
                            } else {
                                second
                            };
                            self.locals.push((c.iter_var.clone(), one));
                            self.locals.push((String::new(), Val::Null));
                        }
                    }
                    let cond = self.eval(&c.loop_cond);
                    let go = matches!(cond, Ok(Val::Bool(true)));
                    let step = if go {
                        Some(self.eval(&c.loop_step))
                    } else {
                        None
                    };
                    self.locals.truncate(self.locals.len() - 3);
                    cond?;
                    match step {
                        Some(s) => accu = s?,
                        None => break,
                    }
                }
                self.locals.push((c.accu_var.clone(), accu));
                let r = self.eval(&c.result);
                self.locals.pop();
                r
            }
            Expr::Struct(_) | Expr::Unspecified => Err("cannot evaluate this expression".into()),
        }
    }

    fn call(&mut self, call: &CallExpr) -> Result<Val, String> {
        let name = call.func_name.as_str();
        match name {
            "_&&_" | "_||_" => {
                let decisive = name == "_||_";
                let mut error = None;
                for a in &call.args {
                    match self.eval(a)? {
                        Val::Bool(b) if b == decisive => return Ok(Val::Bool(b)),
                        Val::Bool(_) => {}
                        Val::Err(e) => error = Some(Val::Err(e)),
                        other => error = Some(Val::err(format!("no such overload: {other:?}"))),
                    }
                }
                return Ok(error.unwrap_or(Val::Bool(!decisive)));
            }
            "_?_:_" => {
                return match self.eval(&call.args[0])? {
                    Val::Bool(true) => self.eval(&call.args[1]),
                    Val::Bool(false) => self.eval(&call.args[2]),
                    Val::Err(e) => Ok(Val::Err(e)),
                    other => Ok(Val::err(format!("no such overload: {other:?} ? ..."))),
                };
            }
            "@not_strictly_false" => {
                let v = self.eval(&call.args[0])?;
                self.cost += 1;
                return Ok(Val::Bool(!matches!(v, Val::Bool(false))));
            }
            "_[_]" => {
                let operand = self.eval(&call.args[0])?;
                let index = self.eval(&call.args[1])?;
                self.cost += if is_attribute(&call.args[0]) { 1 } else { 2 };
                return Ok(index_of(&operand, &index));
            }
            // `maybeOptimizeSetMembership`: against a list literal of scalars, a set lookup
            // whose evaluation the tracker does not charge (and against `[]`, false
            // without evaluating the element).
            "@in" if is_constant(&call.args[1]) => {
                if let Expr::List(l) = &call.args[1].expr {
                    let scalars = l
                        .elements
                        .iter()
                        .all(|x| !matches!(x.expr, Expr::Literal(LiteralValue::Bytes(_))));
                    if l.elements.is_empty() {
                        return Ok(Val::Bool(false));
                    }
                    if scalars {
                        let x = self.eval(&call.args[0])?;
                        let list = self.eval(&call.args[1])?;
                        return self.apply("@in", &[x, list]);
                    }
                }
            }
            _ => {}
        }
        // A namespaced function, as the checker resolved it.
        let (fname, target) = match &call.target {
            Some(t) => match qualified_name(t) {
                Some(q) if self.ctx.lib.has_function(&format!("{q}.{name}")) => {
                    (format!("{q}.{name}"), None)
                }
                _ => (name.to_owned(), Some(t)),
            },
            None => (name.to_owned(), None),
        };
        let member = target.is_some();
        let mut args = vec![];
        if let Some(t) = target {
            args.push(self.eval(t)?);
        }
        for a in &call.args {
            args.push(self.eval(a)?);
        }
        if let Some(e) = args.iter().find(|a| matches!(a, Val::Err(_))) {
            return Ok(e.clone());
        }
        let result = self.apply(&fname, &args)?;
        self.cost += call_cost(&fname, member, &args, &result);
        Ok(result)
    }

    /// The functions the export uses, with cel-go's semantics (ext/strings.go indexes in
    /// code points). Anything else is not evaluable here.
    fn apply(&self, name: &str, args: &[Val]) -> Result<Val, String> {
        let chars = |s: &str| s.chars().collect::<Vec<char>>();
        let no = || Val::err(format!("no such overload: {name}{args:?}"));
        Ok(match (name, args) {
            ("!_", [Val::Bool(b)]) => Val::Bool(!b),
            ("-_", [Val::Int(i)]) => i
                .checked_neg()
                .map_or_else(|| Val::err("overflow"), Val::Int),
            ("-_", [Val::Double(d)]) => Val::Double(-d),
            ("_==_", [a, b]) => Val::Bool(cel_eq(a, b)),
            ("_!=_", [a, b]) => Val::Bool(!cel_eq(a, b)),
            ("_+_", [Val::Str(a), Val::Str(b)]) => Val::str(format!("{a}{b}")),
            ("_+_", [Val::List(a), Val::List(b)]) => {
                Val::List(Rc::new(a.iter().chain(b.iter()).cloned().collect()))
            }
            ("_+_", [Val::Int(a), Val::Int(b)]) => a
                .checked_add(*b)
                .map_or_else(|| Val::err("overflow"), Val::Int),
            ("_-_", [Val::Int(a), Val::Int(b)]) => a
                .checked_sub(*b)
                .map_or_else(|| Val::err("overflow"), Val::Int),
            ("_*_", [Val::Int(a), Val::Int(b)]) => a
                .checked_mul(*b)
                .map_or_else(|| Val::err("overflow"), Val::Int),
            ("_<_" | "_<=_" | "_>_" | "_>=_", [a, b]) => {
                let ord = match (a, b) {
                    (Val::Str(x), Val::Str(y)) => x.cmp(y),
                    (Val::Bool(x), Val::Bool(y)) => x.cmp(y),
                    _ => match (num(a), num(b)) {
                        (Some(x), Some(y)) => {
                            x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
                        }
                        _ => return Ok(no()),
                    },
                };
                use std::cmp::Ordering::*;
                Val::Bool(match name {
                    "_<_" => ord == Less,
                    "_<=_" => ord != Greater,
                    "_>_" => ord == Greater,
                    _ => ord != Less,
                })
            }
            ("@in", [x, Val::List(l)]) => Val::Bool(l.iter().any(|y| cel_eq(x, y))),
            ("@in", [Val::Str(k), Val::Map(m)]) => Val::Bool(m.contains_key(&**k)),
            ("@in", [_, Val::Map(_)]) => Val::Bool(false),
            ("size", [v @ (Val::Str(_) | Val::Bytes(_) | Val::List(_) | Val::Map(_))]) => {
                Val::Int(v.size() as i64)
            }
            ("string", [Val::Str(s)]) => Val::Str(s.clone()),
            ("string", [Val::Int(i)]) => Val::str(i.to_string()),
            ("string", [Val::Bool(b)]) => Val::str(b.to_string()),
            ("int", [Val::Int(i)]) => Val::Int(*i),
            ("dyn", [v]) => v.clone(),
            ("contains", [Val::Str(s), Val::Str(t)]) => Val::Bool(s.contains(&**t)),
            ("startsWith", [Val::Str(s), Val::Str(t)]) => Val::Bool(s.starts_with(&**t)),
            ("endsWith", [Val::Str(s), Val::Str(t)]) => Val::Bool(s.ends_with(&**t)),
            ("matches", [Val::Str(s), Val::Str(p)]) => match compiled(p) {
                Some(re) => Val::Bool(re.is_match(s)),
                None => Val::err(format!("invalid regex {p}")),
            },
            ("lowerAscii", [Val::Str(s)]) => Val::str(s.to_ascii_lowercase()),
            ("upperAscii", [Val::Str(s)]) => Val::str(s.to_ascii_uppercase()),
            // Go's strings.TrimSpace and Rust's trim both strip Unicode White_Space.
            ("trim", [Val::Str(s)]) => Val::str(s.trim()),
            ("replace", [Val::Str(s), Val::Str(from), Val::Str(to)]) => {
                Val::str(s.replace(&**from, to))
            }
            ("join", [Val::List(l)]) | ("join", [Val::List(l), _]) => {
                let sep = match args.get(1) {
                    Some(Val::Str(sep)) => sep.to_string(),
                    _ => String::new(),
                };
                let mut parts = vec![];
                for v in l.iter() {
                    match v {
                        Val::Str(s) => parts.push(s.to_string()),
                        _ => return Ok(no()),
                    }
                }
                Val::str(parts.join(&sep))
            }
            ("substring", [Val::Str(s), Val::Int(start), rest @ ..]) => {
                let cs = chars(s);
                let end = match rest {
                    [Val::Int(e)] => *e,
                    [] => cs.len() as i64,
                    _ => return Ok(no()),
                };
                if *start < 0 || end < *start || end > cs.len() as i64 {
                    Val::err(format!("index out of range: {start}, {end}"))
                } else {
                    Val::str(cs[*start as usize..end as usize].iter().collect::<String>())
                }
            }
            ("indexOf" | "lastIndexOf", [Val::Str(s), Val::Str(sub)]) => {
                let found = if name == "indexOf" {
                    s.find(&**sub)
                } else {
                    s.rfind(&**sub)
                };
                match found {
                    Some(byte) => Val::Int(s[..byte].chars().count() as i64),
                    None => Val::Int(-1),
                }
            }
            ("charAt", [Val::Str(s), Val::Int(i)]) => {
                let cs = chars(s);
                match usize::try_from(*i) {
                    Ok(i) if i < cs.len() => Val::str(cs[i].to_string()),
                    Ok(i) if i == cs.len() => Val::str(""),
                    _ => Val::err("index out of range"),
                }
            }
            ("split", [Val::Str(s), Val::Str(sep)]) => {
                Val::List(Rc::new(s.split(&**sep).map(Val::str).collect()))
            }
            _ => {
                return Err(format!(
                    "cannot evaluate {name} on {} argument(s)",
                    args.len()
                ))
            }
        })
    }
}

fn index_of(operand: &Val, index: &Val) -> Val {
    match (operand, index) {
        (Val::Err(e), _) | (_, Val::Err(e)) => Val::Err(e.clone()),
        (Val::List(l), Val::Int(i)) => match usize::try_from(*i).ok().and_then(|i| l.get(i)) {
            Some(v) => v.clone(),
            None => Val::err(format!("index out of range: {i}")),
        },
        (Val::Map(m), Val::Str(k)) => match m.get(&**k) {
            Some(v) => v.clone(),
            None => Val::err(format!("no such key: {k:?}")),
        },
        (o, i) => Val::err(format!("no such overload: {o:?}[{i:?}]")),
    }
}

/// A policy's expressions, parsed once for many requests.
pub struct Evaluable {
    variables: Vec<(String, String, Rc<IdedExpr>)>,
    validations: Vec<(String, Rc<IdedExpr>)>,
    messages: Vec<(String, Rc<IdedExpr>)>,
    audit: Vec<(String, Rc<IdedExpr>)>,
}

impl Evaluable {
    /// The policy's expressions; it should have passed `check_policy`.
    pub fn new(policy: &Value) -> Result<Evaluable, String> {
        let spec = &policy["spec"];
        let parse = |path: String, src: Option<&str>| -> Result<(String, Rc<IdedExpr>), String> {
            let src = src.unwrap_or_default();
            parse(src)
                .map(|ast| (path.clone(), ast))
                .map_err(|e| format!("{path}: {e}"))
        };
        let mut variables = vec![];
        for (i, v) in list_at(spec, "variables").iter().enumerate() {
            let (path, ast) = parse(
                format!("spec.variables[{i}].expression"),
                str_at(v, "expression"),
            )?;
            variables.push((str_at(v, "name").unwrap_or_default().to_owned(), path, ast));
        }
        let mut validations = vec![];
        let mut messages = vec![];
        for (i, v) in list_at(spec, "validations").iter().enumerate() {
            validations.push(parse(
                format!("spec.validations[{i}].expression"),
                str_at(v, "expression"),
            )?);
            if let Some(m) = str_at(v, "messageExpression").filter(|m| !m.trim().is_empty()) {
                messages.push(parse(
                    format!("spec.validations[{i}].messageExpression"),
                    Some(m),
                )?);
            }
        }
        let mut audit = vec![];
        for (i, a) in list_at(spec, "auditAnnotations").iter().enumerate() {
            audit.push(parse(
                format!("spec.auditAnnotations[{i}].valueExpression"),
                str_at(a, "valueExpression").map(str::trim),
            )?);
        }
        Ok(Evaluable {
            variables,
            validations,
            messages,
            audit,
        })
    }

    /// Evaluates the policy on one request as validator.go does: the validations, the
    /// messageExpressions (all of them, whatever the validations gave), the audit
    /// annotations, each filter with its own lazily evaluated variables.
    pub fn run(&self, lib: &Library, input: &Input) -> Result<Run, String> {
        let mut globals = HashMap::new();
        globals.insert("object", input.object.clone());
        globals.insert("oldObject", Val::Null);
        globals.insert("request", input.request.clone());
        globals.insert("namespaceObject", input.namespace_object.clone());
        let ctx = Ctx { lib, globals };
        let mut run = Run {
            allowed: true,
            ..Run::default()
        };
        // (the filter's cost, its expressions' values, the variables it evaluated)
        type Filtered = (u64, Vec<Val>, HashMap<String, Val>);
        let filter =
            |exprs: &[(String, Rc<IdedExpr>)], run: &mut Run| -> Result<Filtered, String> {
                let mut vars = Vars {
                    ctx: &ctx,
                    defs: &self.variables,
                    cache: HashMap::new(),
                    composition: 0,
                    costs: BTreeMap::new(),
                    errors: vec![],
                };
                let mut total = 0;
                let mut values = vec![];
                for (path, ast) in exprs {
                    let mut ev = Eval {
                        ctx: &ctx,
                        vars: &mut vars,
                        locals: vec![],
                        cost: 0,
                    };
                    let v = ev.eval(ast).map_err(|e| format!("{path}: {e}"))?;
                    let cost = ev.cost;
                    total += cost;
                    let slot = run.costs.entry(path.clone()).or_default();
                    *slot = (*slot).max(cost);
                    if let Val::Err(e) = &v {
                        run.errors.push(format!("{path}: {e}"));
                    }
                    values.push(v);
                }
                for (path, cost) in &vars.costs {
                    let slot = run.costs.entry(path.clone()).or_default();
                    *slot = (*slot).max(*cost);
                }
                run.errors.append(&mut vars.errors);
                Ok((total + vars.composition, values, vars.cache))
            };
        let (cost, values, cache) = filter(&self.validations, &mut run)?;
        run.validations = cost;
        run.allowed = values.iter().all(|v| matches!(v, Val::Bool(true)));
        run.variables = cache.into_iter().collect();
        let (cost, values, _) = filter(&self.messages, &mut run)?;
        run.messages = cost;
        for v in values {
            if let Val::Str(s) = v {
                run.message_bytes.push(s.trim().len());
            }
        }
        let (cost, _, _) = filter(&self.audit, &mut run)?;
        run.audit = cost;
        Ok(run)
    }
}
