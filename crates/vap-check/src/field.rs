//! Field errors: apimachinery's `field.Error`, printed as `Error()` prints it.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorType {
    Required,
    Invalid,
    NotSupported,
    Duplicate,
    Forbidden,
    TooMany,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldError {
    pub field: String,
    pub kind: ErrorType,
    pub value: String,
    pub detail: String,
}

/// Values longer than this are cut when printed: a whole messageExpression in every
/// finding would bury the finding. (The apiserver prints the whole value.)
const PRINTED_VALUE_LIMIT: usize = 160;

fn quoted(value: &str) -> String {
    let cut: String = value.chars().take(PRINTED_VALUE_LIMIT).collect();
    let json = serde_json::to_string(&cut).unwrap_or_default();
    if cut.len() < value.len() {
        format!("{}...\" ({} bytes)", &json[..json.len() - 1], value.len())
    } else {
        json
    }
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: ", self.field)?;
        match self.kind {
            ErrorType::Required if self.detail.is_empty() => write!(f, "Required value"),
            ErrorType::Required => write!(f, "Required value: {}", self.detail),
            ErrorType::Invalid => {
                write!(f, "Invalid value: {}: {}", quoted(&self.value), self.detail)
            }
            ErrorType::NotSupported => {
                write!(
                    f,
                    "Unsupported value: {}: {}",
                    quoted(&self.value),
                    self.detail
                )
            }
            ErrorType::Duplicate => write!(f, "Duplicate value: {}", quoted(&self.value)),
            ErrorType::Forbidden => write!(f, "Forbidden: {}", self.detail),
            ErrorType::TooMany => write!(f, "Too many: {}: {}", self.value, self.detail),
        }
    }
}

pub(crate) fn required(field: &str, detail: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::Required,
        value: String::new(),
        detail: detail.to_owned(),
    }
}

pub(crate) fn invalid(field: &str, value: &str, detail: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::Invalid,
        value: value.to_owned(),
        detail: detail.to_owned(),
    }
}

pub(crate) fn not_supported(field: &str, value: &str, supported: &[&str]) -> FieldError {
    let list: Vec<String> = supported.iter().map(|s| format!("\"{s}\"")).collect();
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::NotSupported,
        value: value.to_owned(),
        detail: format!("supported values: {}", list.join(", ")),
    }
}

pub(crate) fn duplicate(field: &str, value: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::Duplicate,
        value: value.to_owned(),
        detail: String::new(),
    }
}

pub(crate) fn forbidden(field: &str, detail: &str) -> FieldError {
    FieldError {
        field: field.to_owned(),
        kind: ErrorType::Forbidden,
        value: String::new(),
        detail: detail.to_owned(),
    }
}
