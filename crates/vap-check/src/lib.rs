//! What a kube-apiserver checks when a ValidatingAdmissionPolicy and its binding are
//! created, and what it spends evaluating one: a stand-in for tests, since no apiserver
//! runs where they run.
//!
//! kubectl's `--validate=strict` (tests/export_kubectl.rs) holds the objects to the OpenAPI
//! schema only. The apiserver does more before it stores a policy: the strategy's
//! validation (kubernetes/kubernetes `pkg/apis/admissionregistration/validation/validation.go`,
//! `validateValidatingAdmissionPolicySpec`) compiles every CEL expression in the
//! environment the admission plugin will run it in (k8s.io/apiserver
//! `pkg/admission/plugin/cel/compile.go` and `composition.go`, over the libraries of
//! `pkg/cel/environment/base.go`) and refuses the object on any error. This crate does
//! the same, in the same order, and words its findings the way the apiserver's
//! `field.Error`s read (`spec.variables[1].name: Invalid value: "namespace": ...`).
//!
//! What it is made of:
//! - names and structure: `validateVariable`, `validateValidation`,
//!   `validateAuditAnnotation`, the match constraints and the binding, with the
//!   apimachinery name validators (DNS-1123 subdomain, qualified name, label value);
//! - a CEL type checker, a port of cel-go's `checker/checker.go` and `checker/types.go`
//!   (unification with type parameters, overload resolution, comprehension scopes) over the
//!   `cel` crate's parser (its macros expanded into comprehensions as cel-go's are), with
//!   cel-go's post-check validators Kubernetes enables (homogeneous aggregate literals,
//!   regex literals) and the parser's reserved identifiers;
//! - the declarations: the admission variables (`object`, `oldObject`, the typed `request`
//!   and `namespaceObject`, `authorizer`, `variables`) and a table of every function of the
//!   Kubernetes environment with its receiver style and signature, by the Kubernetes minor
//!   version that introduced it;
//! - a runtime cost count: an evaluator that follows cel-go's runtime cost model
//!   (`interpreter/runtimecost.go`, Kubernetes' `pkg/cel/library/cost.go`) over concrete
//!   requests, with the apiserver's per-expression limit and per-evaluation budgets.
//!
//! What it is not: cel-go itself. Known approximations are said where they are made and
//! listed in `KNOWN_GAPS`, and its tests (`tests/rules.rs`) show each check refusing what
//! it claims to refuse.
//!
//! The modules, each importing only from those listed before it:
//! - `limits`: the limits, each where Kubernetes sets it;
//! - `field`: apimachinery's `field.Error`, printed as the apiserver prints it;
//! - `names`: apimachinery's name validators and validation.go's CEL identifiers;
//! - `types`: CEL types and cel-go's unification (`checker/types.go`,
//!   `checker/mapping.go`);
//! - `functions`: the function table of the Kubernetes environment, by version
//!   (`Library`);
//! - `env`: the admission environment's declarations (`Decls`: the root variables, the
//!   request and namespace types, `variables`);
//! - `checker`: the type checker (cel-go `checker/checker.go`) and its post-check
//!   validators;
//! - `compile`: one expression parsed and checked (compile.go `CompileCELExpression`);
//! - `policy`: validation.go's rules over a policy and a binding (`check_policy`,
//!   `check_binding`);
//! - `value`: the values the cost count computes (`Val`);
//! - `cost`: cel-go's and Kubernetes' runtime cost model;
//! - `eval`: the evaluator that counts it over a request (`Evaluable`, `Input`, `Run`,
//!   `limit_violations`).
//!
//! Test-only: the root package's tests/export_apiserver.rs takes it as a dev-dependency
//! (`use tollgate_vap_check as vap_check;`), and no shipped binary links it.
#![forbid(unsafe_code)]

/// What this checker knowingly does differently from a kube-apiserver.
pub const KNOWN_GAPS: &[&str] = &[
    "parsing is the `cel` crate's (built from the same cel-spec ANTLR grammar as cel-go's): \
     its escape handling and parse error texts may differ from cel-go's",
    "compile errors carry no line and column, and printed values over 160 characters are cut",
    "regex literals are compiled with the `regex` crate, whose syntax is close to RE2's",
    "not modelled: paramKind and `params`, struct literals, the duration and timestamp \
     literal validators, resourceNames' path-segment validation",
    "the optional-types library is its latest version from 1.28 on; cel-go's `existsOne` \
     macro is taken to exist at every version",
    "the cost count walks the expression, not cel-go's plan (see the `cost` module), and \
     evaluates only the functions the export uses",
];

mod checker;
mod compile;
mod cost;
mod env;
mod eval;
mod field;
mod functions;
mod limits;
mod names;
mod policy;
mod types;
mod value;

pub use compile::{compile, Compiled};
pub use env::Decls;
pub use eval::{limit_violations, Evaluable, Input, Run};
pub use field::{ErrorType, FieldError};
pub use functions::Library;
pub use limits::{MAX_EVALUATED_MESSAGE_BYTES, PER_CALL_LIMIT, RUNTIME_CEL_COST_BUDGET};
pub use names::{is_cel_identifier, CEL_RESERVED};
pub use policy::{check_binding, check_policy, PolicyCheck};
pub use types::Type;
pub use value::Val;
