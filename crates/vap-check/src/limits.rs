//! Limits, each where Kubernetes sets it.

/// k8s.io/apiserver `pkg/apis/cel/config.go` `PerCallLimit`: the runtime cost one
/// evaluation of one expression may reach (`cel.CostLimit` in `environment/base.go`).
pub const PER_CALL_LIMIT: u64 = 1_000_000;
/// `RuntimeCELCostBudget`: what one policy's evaluation may spend, per filter
/// (`policy/validating/validator.go`: validations, then messageExpressions with what the
/// validations left, and auditAnnotations with a budget of their own).
pub const RUNTIME_CEL_COST_BUDGET: u64 = 10_000_000;
/// `MaxEvaluatedMessageExpressionSizeBytes`: a longer messageExpression result is dropped
/// (`validator.go`: "excessively long message denied") and `message` is used instead.
pub const MAX_EVALUATED_MESSAGE_BYTES: usize = 5 * 1024;
/// validation.go `maxAuditAnnotations`.
pub(crate) const MAX_AUDIT_ANNOTATIONS: usize = 20;
/// validation.go `maxAuditAnnotationValueExpressionLength`, on the trimmed expression.
pub(crate) const MAX_AUDIT_ANNOTATION_VALUE_EXPRESSION_LENGTH: usize = 5 * 1024;
/// validation.go `validateMatchConditions`.
pub(crate) const MAX_MATCH_CONDITIONS: usize = 64;
/// cel-go's default `ExpressionSizeCodePointLimit` (`cel/options.go`), which Kubernetes
/// keeps.
pub(crate) const EXPRESSION_SIZE_CODE_POINT_LIMIT: usize = 100_000;
/// cel-go's default parser recursion limit (`parser/options.go` `maxRecursionDepth`); the
/// `cel` crate's own default (96) is lower and would refuse what cel-go parses.
pub(crate) const PARSER_RECURSION_LIMIT: u16 = 250;
