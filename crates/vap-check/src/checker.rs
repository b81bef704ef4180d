//! The type checker: cel-go `checker/checker.go`, and the post-check validators of
//! cel-go `cel/validator.go` that Kubernetes enables.

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use kube_cel::cel::common::ast::{CallExpr, EntryExpr, Expr, IdedExpr, LiteralValue};
use regex::Regex;

use crate::env::Decls;
use crate::functions::{Library, Overload};
use crate::names::CEL_RESERVED;
use crate::types::{
    internal_is_assignable, internal_is_assignable_list, is_dyn_or_error, list_of, map_of,
    most_general, optional_of, params_of, substitute, unwrap_optional, Mapping, Type,
};

pub(crate) struct Checker<'a> {
    lib: &'a Library,
    decls: &'a Decls,
    /// Comprehension scopes, innermost last.
    scopes: Vec<Vec<(String, Type)>>,
    types: HashMap<u64, Type>,
    pub(crate) m: Mapping,
    fresh: usize,
    pub(crate) errors: Vec<String>,
}

fn literal_type(l: &LiteralValue) -> Type {
    match l {
        LiteralValue::Boolean(_) => Type::Bool,
        LiteralValue::Bytes(_) => Type::Bytes,
        LiteralValue::Double(_) => Type::Double,
        LiteralValue::Int(_) => Type::Int,
        LiteralValue::Null => Type::Null,
        LiteralValue::String(_) => Type::String,
        LiteralValue::UInt(_) => Type::Uint,
    }
}

/// `a.b.c` as a name, if `e` is a chain of (non-presence-test) selects on an identifier:
/// `containers.ToQualifiedName` and the checker's `computeQualifiers`.
pub(crate) fn qualified_name(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Ident(n) => Some(n.clone()),
        Expr::Select(s) if !s.test => {
            qualified_name(&s.operand).map(|prefix| format!("{prefix}.{}", s.field))
        }
        _ => None,
    }
}

impl<'a> Checker<'a> {
    pub(crate) fn new(lib: &'a Library, decls: &'a Decls) -> Self {
        Checker {
            lib,
            decls,
            scopes: vec![],
            types: HashMap::new(),
            m: Mapping::default(),
            fresh: 0,
            errors: vec![],
        }
    }

    fn error(&mut self, msg: String) {
        self.errors.push(msg);
    }

    fn set(&mut self, e: &IdedExpr, t: Type) -> Type {
        self.types.insert(e.id, t.clone());
        t
    }

    fn type_of(&self, e: &IdedExpr) -> Type {
        self.types.get(&e.id).cloned().unwrap_or(Type::Error)
    }

    fn new_var(&mut self) -> Type {
        let t = Type::Param(format!("_var{}", self.fresh));
        self.fresh += 1;
        t
    }

    /// `isAssignable`: keeps the substitutions only if t1 goes where t2 does.
    fn assignable(&mut self, t1: &Type, t2: &Type) -> bool {
        let ok = internal_is_assignable(&mut self.m, t1, t2);
        self.m.settle(ok)
    }

    fn assignable_list(&mut self, l1: &[Type], l2: &[Type]) -> bool {
        let ok = internal_is_assignable_list(&mut self.m, l1, l2);
        self.m.settle(ok)
    }

    fn lookup_ident(&self, name: &str) -> Option<Type> {
        for scope in self.scopes.iter().rev() {
            if let Some((_, t)) = scope.iter().rev().find(|(n, _)| n == name) {
                return Some(t.clone());
            }
        }
        self.decls.idents.get(name).cloned()
    }

    pub(crate) fn check(&mut self, e: &IdedExpr) -> Type {
        match &e.expr {
            Expr::Literal(l) => self.set(e, literal_type(l)),
            Expr::Ident(name) => {
                // cel-go's parser refuses reserved words as identifiers (`VisitIdent`); the
                // `cel` crate's parser does not, so the check is made here.
                if CEL_RESERVED.contains(&name.as_str()) {
                    self.error(format!("reserved identifier: {name}"));
                    return self.set(e, Type::Error);
                }
                match self.lookup_ident(name) {
                    Some(t) => self.set(e, t),
                    None => {
                        self.error(format!(
                            "undeclared reference to '{name}' (in container '')"
                        ));
                        self.set(e, Type::Error)
                    }
                }
            }
            Expr::Select(s) => {
                if !s.test {
                    // A qualified identifier (`authorizer.requestResource`) before a field.
                    if let Some(q) = qualified_name(e) {
                        let first = q.split('.').next().unwrap_or_default();
                        let shadowed = self
                            .scopes
                            .iter()
                            .any(|sc| sc.iter().any(|(n, _)| n == first));
                        if !shadowed {
                            if let Some(t) = self.decls.idents.get(&q).cloned() {
                                return self.set(e, t);
                            }
                        }
                    }
                }
                let t = self.check_select_field(&s.operand, &s.field, false);
                let t = if s.test { Type::Bool } else { t };
                let t = substitute(&self.m, &t, false);
                self.set(e, t)
            }
            Expr::Call(call) => {
                let t = self.check_call(call);
                self.set(e, t)
            }
            Expr::List(list) => {
                let mut elem: Option<Type> = None;
                for (i, x) in list.elements.iter().enumerate() {
                    let mut t = self.check(x);
                    if list.optional_indices.contains(&i) {
                        let (inner, was) = unwrap_optional(&t);
                        if !was && t != Type::Dyn {
                            self.error(format!(
                                "expected type '{}' but found '{t}'",
                                optional_of(t.clone())
                            ));
                        }
                        t = inner;
                    }
                    elem = Some(self.join_types(elem, t));
                }
                let elem = match elem {
                    Some(t) => t,
                    None => self.new_var(),
                };
                self.set(e, list_of(elem))
            }
            Expr::Map(map) => {
                let (mut kt, mut vt): (Option<Type>, Option<Type>) = (None, None);
                for entry in &map.entries {
                    match &entry.expr {
                        EntryExpr::MapEntry(me) => {
                            let k = self.check(&me.key);
                            kt = Some(self.join_types(kt, k));
                            let mut v = self.check(&me.value);
                            if me.optional {
                                v = unwrap_optional(&v).0;
                            }
                            vt = Some(self.join_types(vt, v));
                        }
                        EntryExpr::StructField(_) => {
                            self.error("a struct field in a map literal".into());
                        }
                    }
                }
                let (k, v) = match (kt, vt) {
                    (Some(k), Some(v)) => (k, v),
                    _ => (self.new_var(), self.new_var()),
                };
                self.set(e, map_of(k, v))
            }
            Expr::Struct(s) => {
                // No message types can be built in the admission environment; the only
                // object types are the declared ones above, which have no constructor the
                // export could want. Refused rather than modelled.
                self.error(format!(
                    "undeclared reference to '{}' (in container '') (struct literals are not \
                     modelled by this checker)",
                    s.type_name
                ));
                self.set(e, Type::Error)
            }
            Expr::Comprehension(c) => {
                let t = self.check_comprehension(
                    &c.iter_range,
                    &c.iter_var,
                    c.iter_var2.as_deref(),
                    &c.accu_var,
                    &c.accu_init,
                    &c.loop_cond,
                    &c.loop_step,
                    &c.result,
                );
                self.set(e, t)
            }
            Expr::Unspecified => {
                self.error("unexpected unspecified expression".into());
                self.set(e, Type::Error)
            }
        }
    }

    /// `joinTypes` without `HomogeneousAggregateLiterals` in the checker itself: mixed
    /// elements make dyn, and the post-check validator refuses them (`homogeneous`).
    fn join_types(&mut self, previous: Option<Type>, current: Type) -> Type {
        match previous {
            None => current,
            Some(p) if self.assignable(&p, &current) => most_general(&p, &current),
            Some(_) => Type::Dyn,
        }
    }

    /// `checkSelectField`.
    fn check_select_field(&mut self, operand: &IdedExpr, field: &str, optional: bool) -> Type {
        let operand_type = self.check(operand);
        let operand_type = substitute(&self.m, &operand_type, false);
        let (target, was_optional) = unwrap_optional(&operand_type);
        let result = match &target {
            Type::Map(_, v) => (**v).clone(),
            Type::Object(name) => match self.decls.objects.get(name).and_then(|f| f.get(field)) {
                Some(t) => t.clone(),
                None => {
                    self.error(format!("undefined field '{field}'"));
                    Type::Error
                }
            },
            Type::Param(_) => {
                self.assignable(&Type::Dyn, &target);
                Type::Dyn
            }
            t if is_dyn_or_error(t) => Type::Dyn,
            t => {
                self.error(format!("type '{t}' does not support field selection"));
                Type::Dyn
            }
        };
        if was_optional || optional {
            optional_of(result)
        } else {
            result
        }
    }

    fn check_call(&mut self, call: &CallExpr) -> Type {
        let name = call.func_name.as_str();
        if name == "_?._" {
            // `checkOptSelect`.
            if call.args.len() != 2 || call.target.is_some() {
                self.error("unsupported optional field selection".into());
                return Type::Error;
            }
            let Expr::Literal(LiteralValue::String(field)) = &call.args[1].expr else {
                self.error("unsupported optional field selection".into());
                return Type::Error;
            };
            self.set(&call.args[1], Type::String);
            let t = self.check_select_field(&call.args[0], field.inner(), true);
            return substitute(&self.m, &t, false);
        }
        if let Some(target) = &call.target {
            if self.lib.has_macro(name, call.args.len()) {
                return self.check_macro(name, target, &call.args);
            }
        }
        match &call.target {
            None => {
                if CEL_RESERVED.contains(&name) {
                    self.error(format!("reserved identifier: {name}"));
                    return Type::Error;
                }
                let args: Vec<Type> = call.args.iter().map(|a| self.check(a)).collect();
                self.resolve(name, None, args)
            }
            Some(target) => {
                // A namespaced function (`sets.contains(a, b)`) rather than a receiver.
                if let Some(q) = qualified_name(target) {
                    let full = format!("{q}.{name}");
                    if self.lib.has_function(&full) {
                        let args: Vec<Type> = call.args.iter().map(|a| self.check(a)).collect();
                        return self.resolve(&full, None, args);
                    }
                }
                let args: Vec<Type> = call.args.iter().map(|a| self.check(a)).collect();
                let t = self.check(target);
                self.resolve(name, Some(t), args)
            }
        }
    }

    /// `resolveOverload`.
    fn resolve(&mut self, name: &str, target: Option<Type>, args: Vec<Type>) -> Type {
        let lib = self.lib;
        let Some(overloads) = lib.functions.get(name) else {
            self.error(format!(
                "undeclared reference to '{name}' (in container '')"
            ));
            return Type::Error;
        };
        let member = target.is_some();
        let arg_types: Vec<Type> = target.into_iter().chain(args).collect();
        let mut result: Option<Type> = None;
        for o in overloads {
            if o.member != member {
                continue;
            }
            if name == "_&&_" || name == "_||_" {
                let mut ok = true;
                for a in &arg_types {
                    if !self.assignable(a, &Type::Bool) {
                        self.error(format!("expected type 'bool' but found '{a}'"));
                        ok = false;
                    }
                }
                return if ok { Type::Bool } else { Type::Error };
            }
            let (params, res) = self.instantiate(o);
            if self.assignable_list(&arg_types, &params) {
                let r = substitute(&self.m, &res, false);
                result = Some(match result {
                    None => r,
                    Some(prev) if prev != Type::Dyn && prev != r => Type::Dyn,
                    Some(prev) => prev,
                });
            }
        }
        match result {
            Some(t) => t,
            None => {
                let shown: Vec<String> = arg_types
                    .iter()
                    .map(|t| substitute(&self.m, t, true).to_string())
                    .collect();
                let signature = if member {
                    format!("{}.({})", shown[0], shown[1..].join(", "))
                } else {
                    format!("({})", shown.join(", "))
                };
                self.error(format!(
                    "found no matching overload for '{name}' applied to '{signature}'"
                ));
                Type::Error
            }
        }
    }

    /// An overload's type with its parameters renamed to fresh variables.
    fn instantiate(&mut self, o: &Overload) -> (Vec<Type>, Type) {
        fn collect(t: &Type, out: &mut Vec<String>) {
            if let Type::Param(n) = t {
                if !out.contains(n) {
                    out.push(n.clone());
                }
            }
            for p in params_of(t) {
                collect(p, out);
            }
        }
        let mut names = vec![];
        for p in o.params.iter().chain([&o.result]) {
            collect(p, &mut names);
        }
        if names.is_empty() {
            return (o.params.clone(), o.result.clone());
        }
        let mut sub = Mapping::default();
        for n in names {
            let v = self.new_var();
            sub.insert(n, v);
        }
        (
            o.params
                .iter()
                .map(|p| substitute(&sub, p, false))
                .collect(),
            substitute(&sub, &o.result, false),
        )
    }

    /// The iteration variables' types over a range: (var, var2) as `checkComprehension`
    /// gives them.
    fn range_vars(&mut self, range: &IdedExpr, two: bool) -> (Type, Type) {
        let range_type = substitute(&self.m, &self.type_of(range), false);
        match &range_type {
            Type::List(e) if two => (Type::Int, (**e).clone()),
            Type::List(e) => ((**e).clone(), Type::Error),
            Type::Map(k, v) => ((**k).clone(), (**v).clone()),
            t if is_dyn_or_error(t) || matches!(t, Type::Param(_)) => {
                self.assignable(&Type::Dyn, &range_type);
                (Type::Dyn, Type::Dyn)
            }
            t => {
                self.error(format!(
                    "expression of type '{t}' cannot be range of a comprehension (must be \
                     list, map, or dynamic)"
                ));
                (Type::Error, Type::Error)
            }
        }
    }

    /// `checkComprehension`.
    #[allow(clippy::too_many_arguments)]
    fn check_comprehension(
        &mut self,
        range: &IdedExpr,
        var: &str,
        var2: Option<&str>,
        accu: &str,
        init: &IdedExpr,
        cond: &IdedExpr,
        step: &IdedExpr,
        result: &IdedExpr,
    ) -> Type {
        // cel-go parses a macro's variable as an identifier, which may not be reserved.
        for v in [Some(var), var2].into_iter().flatten() {
            if CEL_RESERVED.contains(&v) {
                self.error(format!("reserved identifier: {v}"));
            }
        }
        self.check(range);
        let accu_type = self.check(init);
        self.scopes.push(vec![(accu.to_owned(), accu_type.clone())]);
        let (vt, v2t) = self.range_vars(range, var2.is_some());
        let mut inner = vec![(var.to_owned(), vt)];
        if let Some(v2) = var2 {
            inner.push((v2.to_owned(), v2t));
        }
        self.scopes.push(inner);
        let c = self.check(cond);
        if !self.assignable(&Type::Bool, &c) {
            self.error(format!("expected type 'bool' but found '{c}'"));
        }
        let s = self.check(step);
        if !self.assignable(&accu_type, &s) {
            self.error(format!("expected type '{accu_type}' but found '{s}'"));
        }
        self.scopes.pop();
        let r = self.check(result);
        self.scopes.pop();
        substitute(&self.m, &r, false)
    }

    /// The macros the parser left as calls, typed as their cel-go expansions type.
    fn check_macro(&mut self, name: &str, target: &IdedExpr, args: &[IdedExpr]) -> Type {
        let ident = |e: &IdedExpr| match &e.expr {
            Expr::Ident(n) => Some(n.clone()),
            _ => None,
        };
        let (Some(v1), second) = (ident(&args[0]), args.get(1).and_then(ident)) else {
            self.error(format!("{name}: argument must be a simple name"));
            return Type::Error;
        };
        let bool_arg = |c: &mut Self, e: &IdedExpr| {
            let t = c.check(e);
            if !c.assignable(&Type::Bool, &t) {
                c.error(format!("expected type 'bool' but found '{t}'"));
            }
        };
        match name {
            "optMap" | "optFlatMap" => {
                let t = self.check(target);
                let t = substitute(&self.m, &t, false);
                let (inner, was) = unwrap_optional(&t);
                if !was && !is_dyn_or_error(&t) {
                    self.error(format!(
                        "found no matching overload for '{name}' applied to '{t}'"
                    ));
                }
                self.scopes.push(vec![(v1, inner)]);
                let r = self.check(&args[1]);
                self.scopes.pop();
                if name == "optMap" {
                    optional_of(r)
                } else {
                    r
                }
            }
            "sortBy" => {
                self.check(target);
                let (elem, _) = self.range_vars(target, false);
                self.scopes.push(vec![(v1, elem)]);
                self.check(&args[1]);
                self.scopes.pop();
                substitute(&self.m, &self.type_of(target), false)
            }
            _ => {
                let Some(v2) = second else {
                    self.error(format!("{name}: argument must be a simple name"));
                    return Type::Error;
                };
                self.check(target);
                let (t1, t2) = self.range_vars(target, true);
                self.scopes.push(vec![(v1, t1.clone()), (v2, t2)]);
                let out = match (name, args.len()) {
                    ("all" | "exists" | "existsOne" | "exists_one", _) => {
                        bool_arg(self, &args[2]);
                        Type::Bool
                    }
                    ("transformList", n) => {
                        if n == 4 {
                            bool_arg(self, &args[2]);
                        }
                        list_of(self.check(&args[n - 1]))
                    }
                    ("transformMap", n) => {
                        if n == 4 {
                            bool_arg(self, &args[2]);
                        }
                        map_of(t1, self.check(&args[n - 1]))
                    }
                    (_, n) => {
                        if n == 4 {
                            bool_arg(self, &args[2]);
                        }
                        let t = self.check(&args[n - 1]);
                        let want = map_of(self.new_var(), self.new_var());
                        if !self.assignable(&want, &t) {
                            self.error(format!("expected type '{want}' but found '{t}'"));
                        }
                        substitute(&self.m, &want, false)
                    }
                };
                self.scopes.pop();
                out
            }
        }
    }

    /// cel-go `cel/validator.go`, the validators base.go turns on: homogeneous aggregate
    /// literals (every list element, map key and map value of one type, dyn counting as a
    /// type of its own; literals inside `format` calls exempt, as ext/formatting.go
    /// registers) and, from 1.29, regex literals (`matches` with a constant pattern must
    /// compile: checked with the `regex` crate, whose syntax is close to RE2's).
    pub(crate) fn validate(&mut self, e: &IdedExpr, in_format: bool) {
        let final_type = |c: &Self, x: &IdedExpr| substitute(&c.m, &c.type_of(x), true);
        match &e.expr {
            Expr::List(list) if !in_format => {
                let mut first: Option<Type> = None;
                for (i, x) in list.elements.iter().enumerate() {
                    let mut t = final_type(self, x);
                    if list.optional_indices.contains(&i) {
                        t = unwrap_optional(&t).0;
                    }
                    match &first {
                        None => first = Some(t),
                        Some(f) if *f != t => {
                            self.error(format!("expected type '{f}' but found '{t}'"));
                            break;
                        }
                        _ => {}
                    }
                }
            }
            Expr::Map(map) if !in_format => {
                let mut first: Option<(Type, Type)> = None;
                for entry in &map.entries {
                    if let EntryExpr::MapEntry(me) = &entry.expr {
                        let k = final_type(self, &me.key);
                        let mut v = final_type(self, &me.value);
                        if me.optional {
                            v = unwrap_optional(&v).0;
                        }
                        match &first {
                            None => first = Some((k, v)),
                            Some((fk, fv)) => {
                                if *fk != k {
                                    self.error(format!("expected type '{fk}' but found '{k}'"));
                                }
                                if *fv != v {
                                    self.error(format!("expected type '{fv}' but found '{v}'"));
                                }
                            }
                        }
                    }
                }
            }
            Expr::Call(call) if call.func_name == "matches" && self.lib.minor >= 29 => {
                if let Some(Expr::Literal(LiteralValue::String(p))) =
                    call.args.first().map(|a| &a.expr)
                {
                    if compiled(p.inner()).is_none() {
                        self.error("invalid matches argument".into());
                    }
                }
            }
            _ => {}
        }
        let in_format = in_format || matches!(&e.expr, Expr::Call(c) if c.func_name == "format");
        for child in children(e) {
            self.validate(child, in_format);
        }
    }
}

/// An expression's direct subexpressions.
fn children(e: &IdedExpr) -> Vec<&IdedExpr> {
    match &e.expr {
        Expr::Call(c) => c.target.iter().map(|t| &**t).chain(&c.args).collect(),
        Expr::Select(s) => vec![&*s.operand],
        Expr::List(l) => l.elements.iter().collect(),
        Expr::Map(m) => m
            .entries
            .iter()
            .flat_map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Struct(s) => s
            .entries
            .iter()
            .flat_map(|en| match &en.expr {
                EntryExpr::MapEntry(me) => vec![&me.key, &me.value],
                EntryExpr::StructField(f) => vec![&f.value],
            })
            .collect(),
        Expr::Comprehension(c) => vec![
            &c.iter_range,
            &c.accu_init,
            &c.loop_cond,
            &c.loop_step,
            &c.result,
        ],
        _ => vec![],
    }
}

/// Each pattern compiled once for the test process and kept (leaked, so that the automaton
/// it builds lazily is kept too): the exports use the same few globs many times over.
pub(crate) fn compiled(pattern: &str) -> Option<&'static Regex> {
    static CACHE: OnceLock<Mutex<HashMap<String, Option<&'static Regex>>>> = OnceLock::new();
    let mut cache = CACHE.get_or_init(Default::default).lock().unwrap();
    *cache
        .entry(pattern.to_owned())
        .or_insert_with(|| Regex::new(pattern).ok().map(|r| &*Box::leak(Box::new(r))))
}
