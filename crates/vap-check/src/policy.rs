//! The objects: validation.go's checks of a ValidatingAdmissionPolicy and its binding,
//! after the v1 defaults (`pkg/apis/admissionregistration/v1/defaults.go`: failurePolicy
//! Fail, matchPolicy Equivalent, empty namespace and object selectors, rule scope "*").

use serde_json::Value;

use crate::compile::compile;
use crate::env::{declared_variable_type, Decls};
use crate::field::{duplicate, forbidden, invalid, not_supported, required, ErrorType, FieldError};
use crate::functions::Library;
use crate::limits::{
    MAX_AUDIT_ANNOTATIONS, MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH, MAX_MATCH_CONDITIONS,
};
use crate::names::{
    dns1123_subdomain_errors, is_cel_identifier, label_value_errors, qualified_name_errors,
};
use crate::types::Type;

pub(crate) fn str_at<'v>(v: &'v Value, key: &str) -> Option<&'v str> {
    v.get(key).and_then(Value::as_str)
}

pub(crate) fn list_at<'v>(v: &'v Value, key: &str) -> &'v [Value] {
    v.get(key)
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

fn has_line_breaks(s: &str) -> bool {
    s.contains(['\n', '\r'])
}

/// A ValidatingAdmissionPolicy as the apiserver takes it, and what it would compile.
pub struct PolicyCheck {
    pub errors: Vec<FieldError>,
    /// Each variable's name and the type `variables.<name>` has for later expressions.
    pub variables: Vec<(String, Type)>,
}

/// `ValidateValidatingAdmissionPolicy`: metadata, then `validateValidatingAdmissionPolicySpec`.
pub fn check_policy(policy: &Value, lib: &Library) -> PolicyCheck {
    let mut errs = vec![];
    let meta = &policy["metadata"];
    let name = str_at(meta, "name").unwrap_or_default();
    object_meta(meta, &mut errs);
    let spec = &policy["spec"];
    match str_at(spec, "failurePolicy").unwrap_or("Fail") {
        "Fail" | "Ignore" => {}
        other => errs.push(not_supported(
            "spec.failurePolicy",
            other,
            &["Fail", "Ignore"],
        )),
    }
    if !spec["paramKind"].is_null() {
        // The declarations below have no `params`; a policy with a paramKind is outside
        // what this checker models.
        errs.push(forbidden(
            "spec.paramKind",
            "not modelled by this checker: the export sets no paramKind",
        ));
    }
    match spec.get("matchConstraints") {
        None | Some(Value::Null) => errs.push(required("spec.matchConstraints", "")),
        Some(mc) => {
            match_resources(mc, "spec.matchConstraints", &mut errs);
            if list_at(mc, "resourceRules").is_empty() {
                errs.push(required("spec.matchConstraints.resourceRules", ""));
            }
        }
    }
    // `validateMatchConditions`: a stateless compiler, so no `variables`.
    let conditions = list_at(spec, "matchConditions");
    if conditions.len() > MAX_MATCH_CONDITIONS {
        errs.push(FieldError {
            field: "spec.matchConditions".into(),
            kind: ErrorType::TooMany,
            value: conditions.len().to_string(),
            detail: format!("must have at most {MAX_MATCH_CONDITIONS} items"),
        });
    }
    let mut condition_names: Vec<&str> = vec![];
    for (i, mc) in conditions.iter().enumerate() {
        let path = format!("spec.matchConditions[{i}]");
        let expr = str_at(mc, "expression").unwrap_or_default();
        if expr.trim().is_empty() {
            errs.push(required(&format!("{path}.expression"), ""));
        } else {
            let decls = Decls::admission(true, None);
            let c = compile(lib, &decls, expr.trim(), Some(&[Type::Bool]));
            if let Some(e) = c.error {
                errs.push(invalid(&format!("{path}.expression"), expr.trim(), &e));
            }
        }
        match str_at(mc, "name").unwrap_or_default() {
            "" => errs.push(required(&format!("{path}.name"), "")),
            n => {
                for e in qualified_name_errors(n) {
                    errs.push(invalid(&format!("{path}.name"), n, &e));
                }
                if condition_names.contains(&n) {
                    errs.push(duplicate(&format!("{path}.name"), n));
                }
                condition_names.push(n);
            }
        }
    }
    // `validateVariable`, in order, each compiled by the composited compiler with the
    // variables before it (`CompileAndStoreVariable`): a later or unknown `variables.x` is
    // an undefined field. A variable that fails to compile is still declared, as dyn
    // (`convertCelTypeToDeclType(nil)`).
    let variable_defs = list_at(spec, "variables");
    let mut variables: Vec<(String, Type)> = vec![];
    for (i, v) in variable_defs.iter().enumerate() {
        let path = format!("spec.variables[{i}]");
        let vname = str_at(v, "name").unwrap_or_default();
        if vname.trim().is_empty() {
            errs.push(required(&format!("{path}.name"), "name is not specified"));
        } else if !is_cel_identifier(vname) {
            errs.push(invalid(
                &format!("{path}.name"),
                vname,
                "name is not a valid CEL identifier",
            ));
        }
        let expr = str_at(v, "expression").unwrap_or_default();
        if expr.trim().is_empty() {
            errs.push(required(
                &format!("{path}.expression"),
                "expression is not specified",
            ));
            continue;
        }
        let decls = Decls::admission(true, Some(&variables));
        let c = compile(lib, &decls, expr, None);
        if let Some(e) = &c.error {
            errs.push(invalid(&format!("{path}.expression"), expr, e));
        }
        let declared = match (&c.error, &c.output) {
            (None, Some(t)) => declared_variable_type(t),
            _ => Type::Dyn,
        };
        match variables.iter_mut().find(|(n, _)| n == vname) {
            Some(slot) => slot.1 = declared,
            None => variables.push((vname.to_owned(), declared)),
        }
    }
    let vars_decl = (!variable_defs.is_empty()).then_some(variables.as_slice());
    let validations = list_at(spec, "validations");
    let annotations = list_at(spec, "auditAnnotations");
    if validations.is_empty() && annotations.is_empty() {
        let msg = "validations or auditAnnotations must contain at least one item";
        errs.push(required("spec.validations", msg));
        errs.push(required("spec.auditAnnotations", msg));
    }
    for (i, v) in validations.iter().enumerate() {
        validation(
            lib,
            v,
            &format!("spec.validations[{i}]"),
            vars_decl,
            &mut errs,
        );
    }
    if annotations.len() > MAX_AUDIT_ANNOTATIONS {
        errs.push(invalid(
            "spec.auditAnnotations",
            &format!("{} items", annotations.len()),
            &format!("must not have more than {MAX_AUDIT_ANNOTATIONS} auditAnnotations"),
        ));
    }
    let mut keys: Vec<&str> = vec![];
    for (i, a) in annotations.iter().enumerate() {
        let path = format!("spec.auditAnnotations[{i}]");
        audit_annotation(lib, name, a, &path, vars_decl, &mut errs);
        let key = str_at(a, "key").unwrap_or_default();
        if keys.contains(&key) {
            errs.push(duplicate(&format!("{path}.key"), key));
        }
        keys.push(key);
    }
    PolicyCheck {
        errors: errs,
        variables,
    }
}

/// `validateValidation`.
fn validation(
    lib: &Library,
    v: &Value,
    path: &str,
    vars: Option<&[(String, Type)]>,
    errs: &mut Vec<FieldError>,
) {
    let expr = str_at(v, "expression").unwrap_or_default();
    if expr.trim().is_empty() {
        errs.push(required(
            &format!("{path}.expression"),
            "expression is not specified",
        ));
    } else {
        let decls = Decls::admission(true, vars);
        if let Some(e) = compile(lib, &decls, expr, Some(&[Type::Bool])).error {
            errs.push(invalid(&format!("{path}.expression"), expr, &e));
        }
    }
    if let Some(m) = str_at(v, "messageExpression") {
        if !m.is_empty() && m.trim().is_empty() {
            errs.push(invalid(
                &format!("{path}.messageExpression"),
                m,
                "must be non-empty if specified",
            ));
        } else if !m.trim().is_empty() {
            // `validateMessageExpression`: no authorizer.
            let decls = Decls::admission(false, vars);
            if let Some(e) = compile(lib, &decls, m, Some(&[Type::String])).error {
                errs.push(invalid(&format!("{path}.messageExpression"), m, &e));
            }
        }
    }
    let msg = str_at(v, "message").unwrap_or_default();
    if !msg.is_empty() && msg.trim().is_empty() {
        errs.push(invalid(
            &format!("{path}.message"),
            msg,
            "message must be non-empty if specified",
        ));
    } else if has_line_breaks(msg.trim()) {
        errs.push(invalid(
            &format!("{path}.message"),
            msg,
            "message must not contain line breaks",
        ));
    }
    // validation.go `supportedValidationPolicyReason`. The API documentation also names
    // Unauthorized, but the validation refuses it.
    if let Some(r) = str_at(v, "reason") {
        let supported = ["Forbidden", "Invalid", "RequestEntityTooLarge"];
        if !supported.contains(&r) {
            errs.push(not_supported(&format!("{path}.reason"), r, &supported));
        }
    }
}

/// `validateAuditAnnotation`.
fn audit_annotation(
    lib: &Library,
    policy_name: &str,
    a: &Value,
    path: &str,
    vars: Option<&[(String, Type)]>,
    errs: &mut Vec<FieldError>,
) {
    let key = str_at(a, "key").unwrap_or_default();
    if policy_name.is_empty() {
        errs.push(invalid(
            &format!("{path}.key"),
            key,
            "requires metadata.name be non-empty",
        ));
    } else {
        let full = format!("{policy_name}/{key}");
        for e in qualified_name_errors(&full) {
            errs.push(invalid(&format!("{path}.key"), &full, &e));
        }
    }
    let expr = str_at(a, "valueExpression").unwrap_or_default();
    let trimmed = expr.trim();
    if trimmed.is_empty() {
        errs.push(required(
            &format!("{path}.valueExpression"),
            "valueExpression is not specified",
        ));
    } else if trimmed.len() > MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH {
        errs.push(required(
            &format!("{path}.valueExpression"),
            &format!(
                "must not exceed {MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH} bytes in length"
            ),
        ));
    } else {
        let decls = Decls::admission(true, vars);
        if let Some(e) = compile(lib, &decls, trimmed, Some(&[Type::String, Type::Null])).error {
            errs.push(invalid(&format!("{path}.valueExpression"), expr, &e));
        }
    }
}

/// `ValidateObjectMeta` as far as these objects go: the name a DNS-1123 subdomain
/// (`NameIsDNSSubdomain`), label keys qualified names, label values valid.
fn object_meta(meta: &Value, errs: &mut Vec<FieldError>) {
    match str_at(meta, "name").unwrap_or_default() {
        "" => errs.push(required(
            "metadata.name",
            "name or generateName is required",
        )),
        name => {
            for e in dns1123_subdomain_errors(name) {
                errs.push(invalid("metadata.name", name, &e));
            }
        }
    }
    if let Some(labels) = meta.get("labels").and_then(Value::as_object) {
        for (k, v) in labels {
            for e in qualified_name_errors(k) {
                errs.push(invalid("metadata.labels", k, &e));
            }
            for e in label_value_errors(v.as_str().unwrap_or_default()) {
                errs.push(invalid(
                    "metadata.labels",
                    v.as_str().unwrap_or_default(),
                    &e,
                ));
            }
        }
    }
}

/// `validateMatchResources`.
fn match_resources(mc: &Value, path: &str, errs: &mut Vec<FieldError>) {
    match str_at(mc, "matchPolicy").unwrap_or("Equivalent") {
        "Exact" | "Equivalent" => {}
        other => errs.push(not_supported(
            &format!("{path}.matchPolicy"),
            other,
            &["Equivalent", "Exact"],
        )),
    }
    for sel in ["namespaceSelector", "objectSelector"] {
        if let Some(s) = mc.get(sel).filter(|s| !s.is_null()) {
            label_selector(s, &format!("{path}.{sel}"), errs);
        }
    }
    for rules in ["resourceRules", "excludeResourceRules"] {
        for (i, r) in list_at(mc, rules).iter().enumerate() {
            rule_with_operations(r, &format!("{path}.{rules}[{i}]"), errs);
        }
    }
}

/// apimachinery `metav1validation.ValidateLabelSelector`, strict about values.
fn label_selector(s: &Value, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(labels) = s.get("matchLabels").and_then(Value::as_object) {
        for (k, v) in labels {
            for e in qualified_name_errors(k) {
                errs.push(invalid(&format!("{path}.matchLabels"), k, &e));
            }
            for e in label_value_errors(v.as_str().unwrap_or_default()) {
                errs.push(invalid(
                    &format!("{path}.matchLabels"),
                    v.as_str().unwrap_or_default(),
                    &e,
                ));
            }
        }
    }
    for (i, r) in list_at(s, "matchExpressions").iter().enumerate() {
        let p = format!("{path}.matchExpressions[{i}]");
        let values = list_at(r, "values");
        match str_at(r, "operator").unwrap_or_default() {
            "In" | "NotIn" if values.is_empty() => errs.push(required(
                &format!("{p}.values"),
                "must be specified when `operator` is 'In' or 'NotIn'",
            )),
            "In" | "NotIn" => {}
            "Exists" | "DoesNotExist" if !values.is_empty() => errs.push(forbidden(
                &format!("{p}.values"),
                "may not be specified when `operator` is 'Exists' or 'DoesNotExist'",
            )),
            "Exists" | "DoesNotExist" => {}
            other => errs.push(invalid(
                &format!("{p}.operator"),
                other,
                "not a valid selector operator",
            )),
        }
        let key = str_at(r, "key").unwrap_or_default();
        for e in qualified_name_errors(key) {
            errs.push(invalid(&format!("{p}.key"), key, &e));
        }
        for (j, v) in values.iter().enumerate() {
            let v = v.as_str().unwrap_or_default();
            for e in label_value_errors(v) {
                errs.push(invalid(&format!("{p}.values[{j}]"), v, &e));
            }
        }
    }
}

/// `validateRuleWithOperations` and `validateRule` (subresources allowed).
fn rule_with_operations(r: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let strings = |key: &str| -> Vec<&str> {
        list_at(r, key)
            .iter()
            .map(|v| v.as_str().unwrap_or_default())
            .collect()
    };
    let ops = strings("operations");
    if ops.is_empty() {
        errs.push(required(&format!("{path}.operations"), ""));
    }
    if ops.len() > 1 && ops.contains(&"*") {
        errs.push(invalid(
            &format!("{path}.operations"),
            &ops.join(","),
            "if '*' is present, must not specify other operations",
        ));
    }
    let supported = ["*", "CONNECT", "CREATE", "DELETE", "UPDATE"];
    for (i, op) in ops.iter().enumerate() {
        if !supported.contains(op) {
            errs.push(not_supported(
                &format!("{path}.operations[{i}]"),
                op,
                &supported,
            ));
        }
    }
    for (key, what) in [("apiGroups", "API groups"), ("apiVersions", "API versions")] {
        let items = strings(key);
        if items.is_empty() {
            errs.push(required(&format!("{path}.{key}"), ""));
        }
        if items.len() > 1 && items.contains(&"*") {
            errs.push(invalid(
                &format!("{path}.{key}"),
                &items.join(","),
                &format!("if '*' is present, must not specify other {what}"),
            ));
        }
    }
    for (i, v) in strings("apiVersions").iter().enumerate() {
        if v.is_empty() {
            errs.push(required(&format!("{path}.apiVersions[{i}]"), ""));
        }
    }
    let resources = strings("resources");
    if resources.is_empty() {
        errs.push(required(&format!("{path}.resources"), ""));
    }
    for (i, res) in resources.iter().enumerate() {
        if res.is_empty() {
            errs.push(required(&format!("{path}.resources[{i}]"), ""));
        }
    }
    if resources.len() > 1 && resources.contains(&"*/*") {
        errs.push(invalid(
            &format!("{path}.resources"),
            &resources.join(","),
            "if '*/*' is present, must not specify other resources",
        ));
    }
    if resources.contains(&"*") && resources.iter().any(|r| *r != "*" && !r.contains('/')) {
        errs.push(invalid(
            &format!("{path}.resources"),
            &resources.join(","),
            "if '*' is present, must not specify other resources without subresources",
        ));
    }
    if let Some(scope) = str_at(r, "scope") {
        let scopes = ["*", "Cluster", "Namespaced"];
        if !scopes.contains(&scope) {
            errs.push(not_supported(&format!("{path}.scope"), scope, &scopes));
        }
    }
}

/// `ValidateValidatingAdmissionPolicyBinding`.
pub fn check_binding(binding: &Value) -> Vec<FieldError> {
    let mut errs = vec![];
    object_meta(&binding["metadata"], &mut errs);
    let spec = &binding["spec"];
    match str_at(spec, "policyName").unwrap_or_default() {
        "" => errs.push(required("spec.policyName", "")),
        name => {
            for e in dns1123_subdomain_errors(name) {
                errs.push(invalid("spec.policyName", name, &e));
            }
        }
    }
    if let Some(mr) = spec.get("matchResources").filter(|m| !m.is_null()) {
        // (sic: the apiserver's path says matchResouces)
        match_resources(mr, "spec.matchResouces", &mut errs);
    }
    let actions: Vec<&str> = list_at(spec, "validationActions")
        .iter()
        .map(|a| a.as_str().unwrap_or_default())
        .collect();
    let supported = ["Audit", "Deny", "Warn"];
    for (i, a) in actions.iter().enumerate() {
        let path = format!("spec.validationActions[{i}]");
        if !supported.contains(a) {
            errs.push(not_supported(&path, a, &supported));
        }
        if actions[..i].contains(a) {
            errs.push(duplicate(&path, a));
        }
    }
    if actions.contains(&"Deny") && actions.contains(&"Warn") {
        errs.push(invalid(
            "spec.validationActions",
            &actions.join(","),
            "must not contain both Deny and Warn (repeating the same validation failure \
             information in the API response and headers serves no purpose)",
        ));
    }
    if actions.is_empty() {
        errs.push(required(
            "spec.validationActions",
            "at least one validation action is required",
        ));
    }
    errs
}
