//! The checker refuses what the apiserver refuses, in the apiserver's words, and counts
//! cost as the model says.

use serde_json::{json, Value};
use tollgate_vap_check::{
    check_binding, check_policy, limit_violations, Evaluable, Input, Library,
};

/// A small policy the apiserver takes: the shape of the export's.
fn good() -> Value {
    json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "validate.tollgate.dev"},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE"], "resources": ["pods"],
                }],
            },
            "variables": [
                {"name": "user", "expression": "has(request.userInfo.username) ? request.userInfo.username : ''"},
                {"name": "requestNamespace", "expression": "has(request.namespace) ? request.namespace : ''"},
                {"name": "names", "expression": "object.spec.containers.map(c, c.name)"},
                {"name": "ok", "expression": "size(variables.names) < 100 && variables.user != ''"},
            ],
            "validations": [{
                "expression": "variables.ok",
                "messageExpression": "'pod by ' + variables.user + ': ' + variables.names.join(', ')",
                "message": "refused",
                "reason": "Forbidden",
            }],
            "auditAnnotations": [{
                "key": "opt-out",
                "valueExpression": "variables.ok ? '' : 'in ' + variables.requestNamespace",
            }],
        },
    })
}

fn errors(policy: &Value) -> Vec<String> {
    check_policy(policy, &Library::kubernetes(36))
        .errors
        .iter()
        .map(|e| e.to_string())
        .collect()
}

/// The policy with one field replaced, and what the apiserver says of it.
fn refused(pointer: &str, value: Value) -> Vec<String> {
    let mut p = good();
    *p.pointer_mut(pointer).unwrap() = value;
    errors(&p)
}

fn expect_one(errs: &[String], start: &str, contains: &str) {
    assert_eq!(errs.len(), 1, "{errs:#?}");
    assert!(errs[0].starts_with(start), "{}", errs[0]);
    assert!(errs[0].contains(contains), "{}", errs[0]);
}

#[test]
fn the_good_policy_passes_and_its_variables_are_typed() {
    let c = check_policy(&good(), &Library::kubernetes(36));
    assert!(c.errors.is_empty(), "{:#?}", c.errors);
    let types: Vec<String> = c
        .variables
        .iter()
        .map(|(n, t)| format!("{n}: {t}"))
        .collect();
    assert_eq!(
        types,
        [
            "user: string",
            "requestNamespace: string",
            "names: list(dyn)",
            "ok: bool"
        ]
    );
}

#[test]
fn a_variable_named_namespace_is_refused() {
    let mut p = good();
    p["spec"]["variables"][1]["name"] = json!("namespace");
    // The apiserver still declares it: `variables.namespace` is a field selection,
    // which a reserved word may be.
    p["spec"]["auditAnnotations"][0]["valueExpression"] =
        json!("variables.ok ? '' : 'in ' + variables.namespace");
    let errs = errors(&p);
    expect_one(
        &errs,
        "spec.variables[1].name: Invalid value: \"namespace\": ",
        "name is not a valid CEL identifier",
    );
    // And the expression may not name it either: cel-go's parser reserves it.
    let errs = refused("/spec/variables/0/expression", json!("namespace + ''"));
    expect_one(
        &errs,
        "spec.variables[0].expression: Invalid value: \"namespace + ''\": compilation failed: ",
        "reserved identifier: namespace",
    );
    // A variable that fails is declared dyn for the rest (`convertCelTypeToDeclType(nil)`),
    // and a validation reading it is then not bool.
    let errs = refused("/spec/variables/3/expression", json!("namespace == ''"));
    assert_eq!(errs.len(), 2, "{errs:#?}");
    assert!(
        errs[0].contains("reserved identifier: namespace"),
        "{}",
        errs[0]
    );
    assert_eq!(
        errs[1],
        "spec.validations[0].expression: Invalid value: \"variables.ok\": must evaluate to bool but got dyn"
    );
}

#[test]
fn a_variable_sees_only_the_variables_before_it() {
    let errs = refused(
        "/spec/variables/0/expression",
        json!("variables.ok ? 'a' : 'b'"),
    );
    expect_one(
        &errs,
        "spec.variables[0].expression: Invalid value: \"variables.ok ? 'a' : 'b'\": compilation failed: ",
        "undefined field 'ok'",
    );
    // Without variables there is no `variables` at all.
    let mut p = good();
    p["spec"]["variables"] = json!([]);
    p["spec"]["auditAnnotations"] = json!([]);
    p["spec"]["validations"][0]["messageExpression"] = json!("'x'");
    let errs = errors(&p);
    expect_one(
        &errs,
        "spec.validations[0].expression: ",
        "undeclared reference to 'variables'",
    );
}

#[test]
fn unknown_functions_and_wrong_overloads_are_refused() {
    let errs = refused(
        "/spec/variables/0/expression",
        json!("request.userInfo.username.lower()"),
    );
    expect_one(
        &errs,
        "spec.variables[0].expression: ",
        "undeclared reference to 'lower'",
    );
    // cel.bind is cel-go's, not Kubernetes'.
    let errs = refused("/spec/variables/0/expression", json!("cel.bind(x, 1, x)"));
    expect_one(
        &errs,
        "spec.variables[0].expression: ",
        "undeclared reference to 'cel'",
    );
    let errs = refused(
        "/spec/variables/0/expression",
        json!("request.userInfo.username.substring('a')"),
    );
    expect_one(
        &errs,
        "spec.variables[0].expression: ",
        "found no matching overload for 'substring' applied to 'string.(string)'",
    );
    // A function newer than the apiserver: the semver library is 1.33's.
    let mut p = good();
    p["spec"]["variables"][0]["expression"] = json!("semver('1.2.3').major() > 0 ? 'a' : 'b'");
    assert!(errors(&p).is_empty());
    let old = check_policy(&p, &Library::kubernetes(32)).errors;
    assert_eq!(old.len(), 1, "{old:?}");
    assert!(old[0]
        .to_string()
        .contains("undeclared reference to 'semver'"));
}

#[test]
fn typed_objects_have_only_their_fields() {
    let errs = refused("/spec/variables/0/expression", json!("request.user"));
    expect_one(
        &errs,
        "spec.variables[0].expression: ",
        "undefined field 'user'",
    );
    let errs = refused(
        "/spec/variables/0/expression",
        json!("namespaceObject.metadata.labelz"),
    );
    expect_one(
        &errs,
        "spec.variables[0].expression: ",
        "undefined field 'labelz'",
    );
    // `object` is dyn: anything goes, as in the apiserver.
    assert!(refused(
        "/spec/variables/0/expression",
        json!("object.whatever.at.all")
    )
    .is_empty());
}

#[test]
fn a_message_expression_must_give_a_string_without_the_authorizer() {
    let errs = refused(
        "/spec/validations/0/messageExpression",
        json!("variables.ok"),
    );
    expect_one(
        &errs,
        "spec.validations[0].messageExpression: Invalid value: \"variables.ok\": ",
        "must evaluate to string but got bool",
    );
    let errs = refused(
        "/spec/validations/0/messageExpression",
        json!("authorizer.group('').resource('pods').check('create').reason()"),
    );
    expect_one(
        &errs,
        "spec.validations[0].messageExpression: ",
        "undeclared reference to 'authorizer'",
    );
    // The validation itself has the authorizer.
    assert!(refused(
        "/spec/validations/0/expression",
        json!("authorizer.group('').resource('pods').check('create').allowed()")
    )
    .is_empty());
}

#[test]
fn a_validation_must_be_exactly_bool() {
    let errs = refused("/spec/validations/0/expression", json!("variables.user"));
    expect_one(
        &errs,
        "spec.validations[0].expression: Invalid value: \"variables.user\": ",
        "must evaluate to bool but got string",
    );
    // dyn is not bool either.
    let errs = refused(
        "/spec/validations/0/expression",
        json!("object.spec.hostNetwork"),
    );
    expect_one(
        &errs,
        "spec.validations[0].expression: ",
        "must evaluate to bool but got dyn",
    );
}

#[test]
fn an_audit_annotation_value_over_5_kib_is_refused() {
    let long = format!("'{}'", "x".repeat(5 * 1024));
    let errs = refused("/spec/auditAnnotations/0/valueExpression", json!(long));
    expect_one(
        &errs,
        "spec.auditAnnotations[0].valueExpression: Required value: ",
        "must not exceed 5120 bytes in length",
    );
    let errs = refused(
        "/spec/auditAnnotations/0/valueExpression",
        json!("variables.ok"),
    );
    expect_one(
        &errs,
        "spec.auditAnnotations[0].valueExpression: ",
        "must evaluate to one of [string null_type] but got bool",
    );
    let errs = refused("/spec/auditAnnotations/0/key", json!("opt out"));
    expect_one(
        &errs,
        "spec.auditAnnotations[0].key: Invalid value: \"validate.tollgate.dev/opt out\": ",
        "name part must consist of",
    );
}

#[test]
fn messages_reasons_and_literals_are_held_to_the_rules() {
    let errs = refused("/spec/validations/0/message", json!("two\nlines"));
    expect_one(
        &errs,
        "spec.validations[0].message: ",
        "must not contain line breaks",
    );
    let errs = refused("/spec/validations/0/reason", json!("Unauthorized"));
    expect_one(
        &errs,
        "spec.validations[0].reason: Unsupported value: \"Unauthorized\"",
        "Forbidden",
    );
    let errs = refused("/spec/variables/0/expression", json!("[1, 'a']"));
    expect_one(
        &errs,
        "spec.variables[0].expression: ",
        "expected type 'int' but found 'string'",
    );
    let errs = refused("/spec/variables/0/expression", json!("'a'.matches('(')"));
    expect_one(
        &errs,
        "spec.variables[0].expression: ",
        "invalid matches argument",
    );
}

#[test]
fn bindings_are_checked() {
    let b = json!({
        "metadata": {"name": "validate.tollgate.dev"},
        "spec": {"policyName": "validate.tollgate.dev", "validationActions": ["Deny", "Warn"]},
    });
    let errs: Vec<String> = check_binding(&b).iter().map(|e| e.to_string()).collect();
    expect_one(
        &errs,
        "spec.validationActions: Invalid value: ",
        "must not contain both Deny and Warn",
    );
}

#[test]
fn the_cost_count_follows_the_model() {
    let lib = Library::kubernetes(36);
    let p = good();
    let e = Evaluable::new(&p).unwrap();
    let containers: Vec<Value> = (0..3).map(|i| json!({"name": format!("c{i}")})).collect();
    let input = Input::new(
        &json!({"spec": {"containers": containers}}),
        &json!({"userInfo": {"username": "alice"}, "namespace": "ml"}),
        &json!({"metadata": {"name": "ml"}}),
    );
    let run = e.run(&lib, &input).unwrap();
    assert!(run.allowed, "{run:?}");
    assert!(run.errors.is_empty(), "{:?}", run.errors);
    // `has(request.userInfo.username) ? request.userInfo.username : ''`:
    // has: request (1) + userInfo (1) + the tested field (0); the true branch 3.
    assert_eq!(run.costs["spec.variables[0].expression"], 5);
    // `object.spec.containers.map(c, c.name)` over 3: the range 3, the initial `[]` 0
    // (a constant), per element the step `@result + [c.name]`: @result 1, the list
    // 10, c.name 2, `+` 1; the result 1.
    assert_eq!(run.costs["spec.variables[2].expression"], 3 + 3 * 14 + 1);
    // `size(variables.names) < 100 && variables.user != ''`: 2 + 1 + 1, and 2 + the
    // comparison of "alice" with "" (the shorter's size, 0, a tenth of it, 0).
    assert_eq!(run.costs["spec.variables[3].expression"], 4 + 2);
    assert_eq!(run.costs["spec.validations[0].expression"], 2);
    // The validations' filter: the expression and the variables it needed.
    assert_eq!(run.validations, 2 + 6 + 46 + 5);
    assert!(limit_violations(&run).is_empty());
    assert_eq!(run.message_bytes, ["pod by alice: c0, c1, c2".len()]);
}

#[test]
fn the_cost_of_each_construct() {
    // (expression, how a validation reads it, its cost), the user being "alice".
    let cases = [
        // request, userInfo, username: 3; `+` of 5 and 5 characters: ceil(10 / 10).
        ("request.userInfo.username + 'xxxxx'", "!= ''", 3 + 1),
        // replace: ceil(5 * 2 / 10).
        (
            "request.userInfo.username.replace('a', 'b')",
            "!= ''",
            3 + 1,
        ),
        // A constant list 0; join: ceil(2 * 8 / 10) for "abc, def".
        ("['abc', 'def'].join(', ')", "!= ''", 2),
        // matches: ceil((1 + 5) / 10) * ceil(5 / 4).
        ("request.userInfo.username.matches('^a.*$')", "", 3 + 2),
        // A set lookup: only the element is charged.
        ("request.userInfo.username in ['alice', 'bob']", "", 3),
        // A list of a non-constant 10 + 3; the index of a non-attribute 2.
        ("[request.userInfo.username][0]", "!= ''", 10 + 3 + 2),
        // has: 1 + 0; size 3 + 1; `>` 1; `&&` nothing.
        (
            "has(request.namespace) && size(request.userInfo.username) > 3",
            "",
            1 + 5,
        ),
        // all over 3: the range 3; per element the condition
        // `@not_strictly_false(@result)` 2 and the step `@result && has(c.name)` 2; the
        // result 1.
        (
            "object.spec.containers.all(c, has(c.name))",
            "",
            3 + 3 * 4 + 1,
        ),
    ];
    let variables: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, (e, _, _))| json!({"name": format!("e{i}"), "expression": e}))
        .collect();
    let validations: Vec<Value> = cases
        .iter()
        .enumerate()
        .map(|(i, (_, read, _))| json!({"expression": format!("variables.e{i} {read}")}))
        .collect();
    let mut p = good();
    p["spec"]["variables"] = json!(variables);
    p["spec"]["validations"] = json!(validations);
    p["spec"]["auditAnnotations"] = json!([]);
    assert_eq!(errors(&p), Vec::<String>::new());
    let containers: Vec<Value> = (0..3).map(|i| json!({"name": format!("c{i}")})).collect();
    let input = Input::new(
        &json!({"spec": {"containers": containers}}),
        &json!({"userInfo": {"username": "alice"}, "namespace": "ml"}),
        &json!({}),
    );
    let run = Evaluable::new(&p)
        .unwrap()
        .run(&Library::kubernetes(36), &input)
        .unwrap();
    assert!(run.allowed && run.errors.is_empty(), "{run:?}");
    for (i, (e, _, cost)) in cases.iter().enumerate() {
        assert_eq!(
            run.costs[&format!("spec.variables[{i}].expression")],
            *cost,
            "{e}"
        );
    }
}
