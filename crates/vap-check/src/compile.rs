//! One expression parsed and checked: compile.go `CompileCELExpression`.

use std::collections::HashMap;
use std::rc::Rc;

use kube_cel::cel::common::ast::IdedExpr;
use kube_cel::cel::parser::Parser;

use crate::checker::Checker;
use crate::env::Decls;
use crate::functions::Library;
use crate::limits::{EXPRESSION_SIZE_CODE_POINT_LIMIT, PARSER_RECURSION_LIMIT};
use crate::types::{substitute, type_string, Type};

/// `source` parsed as cel-go's parser would (optional syntax on: `cel.OptionalTypes()`),
/// once per thread: the exports repeat most expressions, and each is checked at two
/// versions and evaluated.
pub(crate) fn parse(source: &str) -> Result<Rc<IdedExpr>, String> {
    thread_local! {
        static PARSED: std::cell::RefCell<HashMap<String, Result<Rc<IdedExpr>, String>>> =
            Default::default();
    }
    PARSED.with(|cache| {
        cache
            .borrow_mut()
            .entry(source.to_owned())
            .or_insert_with(|| {
                Parser::new()
                    .enable_optional_syntax(true)
                    .max_recursion_depth(PARSER_RECURSION_LIMIT)
                    .parse(source)
                    .map(Rc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    })
}

/// One expression compiled: compile.go `CompileCELExpression`.
#[derive(Debug)]
pub struct Compiled {
    pub ast: Option<Rc<IdedExpr>>,
    /// The output type, unbound type parameters made dyn (`ast.OutputType()`).
    pub output: Option<Type>,
    /// The apiserver's `Detail` for the field error, if the expression is refused.
    pub error: Option<String>,
}

/// Parses and checks `source`; then the output type must be exactly one of `returns`
/// (`ast.OutputType().IsExactType(returnType)`: dyn is not bool), or anything when
/// `returns` is None (a variable's `ReturnTypes()` is `cel.AnyType`).
pub fn compile(lib: &Library, decls: &Decls, source: &str, returns: Option<&[Type]>) -> Compiled {
    let failed = |msg: String| Compiled {
        ast: None,
        output: None,
        error: Some(format!("compilation failed: {msg}")),
    };
    let size = source.chars().count();
    if size > EXPRESSION_SIZE_CODE_POINT_LIMIT {
        return failed(format!(
            "ERROR: <input>:-1:0: expression code point size exceeds limit: size: {size}, \
             limit {EXPRESSION_SIZE_CODE_POINT_LIMIT}"
        ));
    }
    let ast = match parse(source) {
        Ok(ast) => ast,
        Err(e) => return failed(e),
    };
    let mut c = Checker::new(lib, decls);
    let t = c.check(&ast);
    c.validate(&ast, false);
    if !c.errors.is_empty() {
        let msgs: Vec<String> = c
            .errors
            .iter()
            .map(|m| format!("ERROR: <input>: {m}"))
            .collect();
        return failed(msgs.join("\n"));
    }
    let output = substitute(&c.m, &t, true);
    if let Some(returns) = returns {
        if !returns.contains(&output) {
            let got = type_string(&output);
            let error = if returns.len() == 1 {
                format!(
                    "must evaluate to {} but got {got}",
                    type_string(&returns[0])
                )
            } else {
                let names: Vec<String> = returns.iter().map(type_string).collect();
                format!(
                    "must evaluate to one of [{}] but got {got}",
                    names.join(" ")
                )
            };
            return Compiled {
                ast: Some(ast),
                output: Some(output),
                error: Some(error),
            };
        }
    }
    Compiled {
        ast: Some(ast),
        output: Some(output),
        error: None,
    }
}
