//! Declarations: the variables an admission expression sees (compile.go
//! `createEnvForOpts`, composition.go `NewCompositedCompiler`).

use std::collections::BTreeMap;

use crate::functions::TYPE_IDENTS;
use crate::types::{list_of, map_of, parse_type, Type};

/// The identifiers and object types one expression is compiled with.
#[derive(Debug, Clone)]
pub struct Decls {
    pub(crate) idents: BTreeMap<String, Type>,
    pub(crate) objects: BTreeMap<String, BTreeMap<String, Type>>,
}

fn fields(list: &[(&str, Type)]) -> BTreeMap<String, Type> {
    list.iter()
        .map(|(n, t)| ((*n).to_owned(), t.clone()))
        .collect()
}

fn object(name: &str) -> Type {
    Type::Object(name.to_owned())
}

/// The object type of `variables`: composition.go `variablesTypeName`.
const VARIABLES_TYPE: &str = "kubernetes.variables";

impl Decls {
    /// `object`, `oldObject`, `request`, `namespaceObject`; `authorizer` and
    /// `authorizer.requestResource` when `authorizer` (every expression but a
    /// messageExpression: plugin.go `expressionOptionalVars`); `variables` with the given
    /// fields when the policy has variables (validation.go `createCompiler`: the composited
    /// compiler only then). No `params`: the export sets no paramKind.
    pub fn admission(authorizer: bool, variables: Option<&[(String, Type)]>) -> Decls {
        let s = || Type::String;
        let mut objects = BTreeMap::new();
        // compile.go `BuildRequestType`.
        let gvk = fields(&[("group", s()), ("version", s()), ("kind", s())]);
        let gvr = fields(&[("group", s()), ("version", s()), ("resource", s())]);
        objects.insert("kubernetes.GroupVersionKind".to_owned(), gvk);
        objects.insert("kubernetes.GroupVersionResource".to_owned(), gvr);
        objects.insert(
            "kubernetes.UserInfo".to_owned(),
            fields(&[
                ("username", s()),
                ("uid", s()),
                ("groups", list_of(s())),
                ("extra", map_of(s(), list_of(s()))),
            ]),
        );
        objects.insert(
            "kubernetes.AdmissionRequest".to_owned(),
            fields(&[
                ("kind", object("kubernetes.GroupVersionKind")),
                ("resource", object("kubernetes.GroupVersionResource")),
                ("subResource", s()),
                ("requestKind", object("kubernetes.GroupVersionKind")),
                ("requestResource", object("kubernetes.GroupVersionResource")),
                ("requestSubResource", s()),
                ("name", s()),
                ("namespace", s()),
                ("operation", s()),
                ("userInfo", object("kubernetes.UserInfo")),
                ("dryRun", Type::Bool),
                ("options", Type::Dyn),
            ]),
        );
        // compile.go `BuildNamespaceType`.
        objects.insert(
            "kubernetes.NamespaceSpec".to_owned(),
            fields(&[("finalizers", list_of(s()))]),
        );
        objects.insert(
            "kubernetes.NamespaceCondition".to_owned(),
            fields(&[
                ("status", s()),
                ("type", s()),
                ("lastTransitionTime", Type::Timestamp),
                ("message", s()),
                ("reason", s()),
            ]),
        );
        objects.insert(
            "kubernetes.NamespaceStatus".to_owned(),
            fields(&[
                (
                    "conditions",
                    list_of(object("kubernetes.NamespaceCondition")),
                ),
                ("phase", s()),
            ]),
        );
        objects.insert(
            "kubernetes.NamespaceMetadata".to_owned(),
            fields(&[
                ("name", s()),
                ("generateName", s()),
                ("namespace", s()),
                ("labels", map_of(s(), s())),
                ("annotations", map_of(s(), s())),
                ("UID", s()),
                ("creationTimestamp", Type::Timestamp),
                ("deletionGracePeriodSeconds", Type::Int),
                ("deletionTimestamp", Type::Timestamp),
                ("generation", Type::Int),
                ("resourceVersion", s()),
                ("finalizers", list_of(s())),
            ]),
        );
        objects.insert(
            "kubernetes.Namespace".to_owned(),
            fields(&[
                ("metadata", object("kubernetes.NamespaceMetadata")),
                ("spec", object("kubernetes.NamespaceSpec")),
                ("status", object("kubernetes.NamespaceStatus")),
            ]),
        );
        let mut idents = BTreeMap::new();
        idents.insert("object".to_owned(), Type::Dyn);
        idents.insert("oldObject".to_owned(), Type::Dyn);
        idents.insert("request".to_owned(), object("kubernetes.AdmissionRequest"));
        idents.insert("namespaceObject".to_owned(), object("kubernetes.Namespace"));
        if authorizer {
            idents.insert(
                "authorizer".to_owned(),
                object("kubernetes.authorization.Authorizer"),
            );
            idents.insert(
                "authorizer.requestResource".to_owned(),
                object("kubernetes.authorization.ResourceCheck"),
            );
        }
        if let Some(vars) = variables {
            objects.insert(
                VARIABLES_TYPE.to_owned(),
                vars.iter().map(|(n, t)| (n.clone(), t.clone())).collect(),
            );
            idents.insert("variables".to_owned(), object(VARIABLES_TYPE));
        }
        for (name, t) in TYPE_IDENTS {
            idents.insert(name.to_owned(), Type::Meta(Some(Box::new(parse_type(t)))));
        }
        Decls { idents, objects }
    }
}

/// composition.go `convertCelTypeToDeclType`: the type a variable is declared with in
/// `variables`, from its expression's output type. Objects, optionals and anything else
/// that is not a primitive, list or map become dyn.
pub(crate) fn declared_variable_type(t: &Type) -> Type {
    match t {
        Type::Bool
        | Type::Bytes
        | Type::Double
        | Type::Duration
        | Type::Int
        | Type::Null
        | Type::String
        | Type::Timestamp
        | Type::Uint => t.clone(),
        Type::List(e) => list_of(declared_variable_type(e)),
        Type::Map(k, v) => map_of(declared_variable_type(k), declared_variable_type(v)),
        _ => Type::Dyn,
    }
}
