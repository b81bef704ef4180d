//! The golden cases (`tests/golden/*/`), read in one place for every test that walks them:
//! the golden runner (tests/golden.rs: the engine, the HTTP router and `tollgate review`),
//! e2e, accepted, audit and export_equivalence.
//!
//! A case's input is one of:
//! - `fixture: NAME` in its `case.yaml`: a review of `tests/fixtures/apiserver-v1.36/`, read
//!   from there (a case that only replays what the apiserver sent holds no copy of it);
//! - `review.json`: an AdmissionReview of the case's own (an UPDATE with its `oldObject`, a
//!   kind no fixture has);
//! - `pod.yaml` or `workload.yaml`: an object, sent as the CREATE review the apiserver would
//!   send (`namespace`, `user`, `groups` of `case.yaml` say where and by whom).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::Value;

/// `case.yaml`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Spec {
    pub endpoint: String,
    /// The fixture the case sends (a file name of `tests/fixtures/apiserver-v1.36/`).
    #[serde(default)]
    pub fixture: Option<String>,
    /// For a `pod.yaml` or `workload.yaml` input: where, by whom.
    #[serde(default)]
    pub namespace: Option<String>,
    #[serde(default = "default_user")]
    pub user: String,
    #[serde(default)]
    pub groups: Vec<String>,
    /// What the case is about, for whoever reads it.
    #[serde(default)]
    pub description: String,
}

fn default_user() -> String {
    "tollgate-review".into()
}

/// What a case sends.
#[derive(Debug, Clone)]
pub enum Input {
    /// An AdmissionReview, sent as it is (a fixture's or the case's `review.json`).
    Review(Value),
    /// A pod or a workload, as its file holds it.
    Object(Value),
}

#[derive(Debug, Clone)]
pub struct Case {
    /// The folder's name.
    pub name: String,
    pub dir: PathBuf,
    pub spec: Spec,
    /// The file the input is read from: the fixture, `review.json`, `pod.yaml` or
    /// `workload.yaml` (what `tollgate review` is given).
    pub input_path: PathBuf,
    pub input: Input,
    /// The case's `policy.yaml`, if it has one (the shipped policy otherwise).
    pub policy: Option<PathBuf>,
    /// `context.yaml`'s text, if it has one.
    pub context_text: Option<String>,
}

/// The golden cases' folders (`tests/golden/*/`), sorted.
pub fn dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(super::root().join("tests/golden"))
        .expect("tests/golden exists")
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    dirs
}

/// Every case, sorted by name; a case that does not load fails the test (the golden
/// runner says why, case by case).
pub fn cases() -> Vec<Case> {
    dirs()
        .iter()
        .map(|d| Case::load(d).unwrap_or_else(|e| panic!("{}: {e}", d.display())))
        .collect()
}

impl Case {
    pub fn load(dir: &Path) -> Result<Case, String> {
        let text = std::fs::read_to_string(dir.join("case.yaml"))
            .map_err(|e| format!("case.yaml: {e}"))?;
        let spec: Spec = serde_saphyr::from_str(&text).map_err(|e| format!("case.yaml: {e}"))?;
        let review_json = dir.join("review.json");
        let objects: Vec<PathBuf> = ["pod.yaml", "workload.yaml"]
            .iter()
            .map(|f| dir.join(f))
            .filter(|p| p.exists())
            .collect();
        let inputs =
            usize::from(spec.fixture.is_some()) + usize::from(review_json.exists()) + objects.len();
        if inputs != 1 {
            return Err(format!(
                "{inputs} inputs: give one of `fixture:` in case.yaml, review.json, pod.yaml \
                 or workload.yaml"
            ));
        }
        let review_at = |p: PathBuf| -> Result<(PathBuf, Input), String> {
            let bytes = std::fs::read(&p).map_err(|e| format!("{}: {e}", p.display()))?;
            let v = serde_json::from_slice(&bytes).map_err(|e| format!("{}: {e}", p.display()))?;
            Ok((p, Input::Review(v)))
        };
        let (input_path, input) = match (&spec.fixture, objects.first()) {
            (Some(name), _) => review_at(super::fixture_path(name))?,
            (None, Some(p)) => {
                let text = std::fs::read_to_string(p).unwrap();
                let v =
                    serde_saphyr::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?;
                (p.clone(), Input::Object(v))
            }
            (None, None) => review_at(review_json)?,
        };
        Ok(Case {
            name: dir.file_name().unwrap().to_string_lossy().into_owned(),
            dir: dir.to_owned(),
            spec,
            input_path,
            input,
            policy: Some(dir.join("policy.yaml")).filter(|p| p.exists()),
            context_text: std::fs::read_to_string(dir.join("context.yaml")).ok(),
        })
    }

    /// Whether the input is an AdmissionReview (sent as it is).
    pub fn is_review(&self) -> bool {
        matches!(self.input, Input::Review(_))
    }

    /// The AdmissionReview the case sends: its own, or the CREATE review of its object as
    /// `tollgate review` makes it.
    pub fn review(&self) -> Value {
        match &self.input {
            Input::Review(v) => v.clone(),
            Input::Object(o) => tollgate::cli::synthetic_review(
                o,
                self.spec.namespace.as_deref(),
                &self.spec.user,
                &self.spec.groups,
            ),
        }
    }

    /// The object as the case sends it: the review's, or the file's as written.
    pub fn object(&self) -> &Value {
        match &self.input {
            Input::Review(v) => &v["request"]["object"],
            Input::Object(o) => o,
        }
    }

    /// The review's `request`; None for an object file.
    pub fn request(&self) -> Option<&Value> {
        match &self.input {
            Input::Review(v) => Some(&v["request"]),
            Input::Object(_) => None,
        }
    }

    /// The namespace the object is sent in.
    pub fn namespace(&self) -> String {
        match &self.input {
            Input::Review(v) => v["request"]["namespace"].as_str(),
            Input::Object(o) => self
                .spec
                .namespace
                .as_deref()
                .or(o["metadata"]["namespace"].as_str()),
        }
        .unwrap_or("default")
        .to_owned()
    }

    /// Who sends it, and their groups (as given: the apiserver adds
    /// `system:authenticated` itself).
    pub fn requester(&self) -> (String, Vec<String>) {
        match &self.input {
            Input::Review(v) => {
                let info = &v["request"]["userInfo"];
                let groups = info["groups"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|g| g.as_str().map(str::to_owned))
                    .collect();
                (info["username"].as_str().unwrap_or("").to_owned(), groups)
            }
            Input::Object(_) => (self.spec.user.clone(), self.spec.groups.clone()),
        }
    }

    /// The policy file the case runs under: its own, or the shipped one.
    pub fn policy_path(&self) -> PathBuf {
        self.policy
            .clone()
            .unwrap_or_else(super::default_policy_path)
    }

    /// `context.yaml`'s documents, as `tollgate review` reads them.
    pub fn context(&self) -> Vec<Value> {
        self.context_text
            .as_deref()
            .map(|t| tollgate::cli::documents(t).unwrap())
            .unwrap_or_default()
    }

    /// Whether the case reviews a workload rather than a pod.
    pub fn is_workload(&self) -> bool {
        self.review().pointer("/request/kind/kind") != Some(&Value::from("Pod"))
    }

    /// The expected `mutated.yaml`, if the case has one.
    pub fn mutated(&self) -> Option<Value> {
        std::fs::read_to_string(self.dir.join("mutated.yaml"))
            .ok()
            .map(|t| serde_saphyr::from_str(&t).unwrap())
    }

    /// The expected `response.json`.
    pub fn response(&self) -> Value {
        serde_json::from_slice(&std::fs::read(self.dir.join("response.json")).unwrap()).unwrap()
    }
}
