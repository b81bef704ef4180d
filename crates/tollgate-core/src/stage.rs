//! Which of tollgate's webhooks run: the one type that says it, for the parse of a review
//! (how much of a pod to read), the judgement, the review's answers, `tollgate review
//! --stage`, and the routes and their metrics.

/// Which webhooks judge an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// The mutating webhook alone (`/mutate`).
    Mutate,
    /// The validating webhook alone (`/validate`), on the object as the apiserver sends it:
    /// mutated and defaulted already.
    Validate,
    /// Both, in a cluster's order, with the apiserver's defaulting between them (`tollgate
    /// review --stage all`, the audit).
    All,
}

impl Stage {
    /// The two webhooks, each alone: what answers a review posted to tollgate.
    pub const WEBHOOKS: [Stage; 2] = [Stage::Mutate, Stage::Validate];

    /// `mutate`, `validate` or `all`: the webhook's path and metric label, and `--stage`.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::Mutate => "mutate",
            Stage::Validate => "validate",
            Stage::All => "all",
        }
    }

    /// Whether the mutating webhook runs.
    pub fn mutates(self) -> bool {
        matches!(self, Stage::Mutate | Stage::All)
    }

    /// Whether the validating webhook runs.
    pub fn validates(self) -> bool {
        matches!(self, Stage::Validate | Stage::All)
    }

    /// The webhook that answers first: the one whose answer an object neither judges gets.
    pub fn first(self) -> Stage {
        match self {
            Stage::Validate => Stage::Validate,
            Stage::Mutate | Stage::All => Stage::Mutate,
        }
    }
}

impl std::str::FromStr for Stage {
    type Err = String;

    /// As `as_str` writes it.
    fn from_str(s: &str) -> Result<Stage, String> {
        [Stage::All, Stage::Mutate, Stage::Validate]
            .into_iter()
            .find(|x| x.as_str() == s)
            .ok_or_else(|| format!("{s:?} is not one of all, mutate, validate"))
    }
}
