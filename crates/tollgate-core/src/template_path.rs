//! Where a workload keeps its pod templates: a small path language over JSON values.
//!
//! A path is dot-separated keys, with two ways to fan out:
//! - `*` stands for every member of a map, named by its key
//!   (`spec.pytorchReplicaSpecs.*.template`: replicas `Master`, `Worker`);
//! - `key[*]` stands for every element of the list `key`, named by the element's `name`, or
//!   its `groupName` (Ray's worker groups), else its index
//!   (`spec.replicatedJobs[*].template.spec.template`).
//!
//! Nothing else: no filters, no recursion. A path that finds nothing is not an error; the
//! review says so in a warning.

use serde_json::Value;

/// A parsed template path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Path {
    segments: Vec<Segment>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    /// Every member of a map.
    Members,
    /// Every element of a list.
    Elements,
}

/// A template the path found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Found<'v> {
    /// Where it is, as a JSON pointer (`/spec/pytorchReplicaSpecs/Worker/template`).
    pub pointer: String,
    /// The names the fan-outs on the way gave it, outermost first (`["Worker"]`).
    pub names: Vec<String>,
    pub value: &'v Value,
}

impl Path {
    pub(crate) fn parse(text: &str) -> Result<Path, String> {
        if text.is_empty() {
            return Err("an empty path".into());
        }
        let mut segments = vec![];
        for part in text.split('.') {
            let (key, list) = match part.strip_suffix("[*]") {
                Some(k) => (k, true),
                None => (part, false),
            };
            if key == "*" && !list {
                segments.push(Segment::Members);
                continue;
            }
            if key.is_empty() || key.contains(['[', ']', '*']) {
                return Err(format!(
                    "{part:?} in {text:?} is not a key, `*` or `key[*]`"
                ));
            }
            segments.push(Segment::Key(key.to_owned()));
            if list {
                segments.push(Segment::Elements);
            }
        }
        Ok(Path { segments })
    }

    /// Every value at this path in `root`, in document order. A missing key, or a value of
    /// the wrong shape on the way (a map where a list was expected), finds nothing there.
    pub(crate) fn find<'v>(&self, root: &'v Value) -> Vec<Found<'v>> {
        let mut out = vec![];
        walk(
            &self.segments,
            root,
            &mut String::new(),
            &mut vec![],
            &mut out,
        );
        out
    }
}

fn walk<'v>(
    rest: &[Segment],
    at: &'v Value,
    pointer: &mut String,
    names: &mut Vec<String>,
    out: &mut Vec<Found<'v>>,
) {
    let Some((first, rest)) = rest.split_first() else {
        if !at.is_null() {
            out.push(Found {
                pointer: pointer.clone(),
                names: names.clone(),
                value: at,
            });
        }
        return;
    };
    let len = pointer.len();
    match first {
        Segment::Key(k) => {
            if let Some(v) = at.get(k) {
                push_token(pointer, k);
                walk(rest, v, pointer, names, out);
            }
        }
        Segment::Members => {
            for (k, v) in at.as_object().into_iter().flatten() {
                push_token(pointer, k);
                names.push(k.clone());
                walk(rest, v, pointer, names, out);
                names.pop();
                pointer.truncate(len);
            }
        }
        Segment::Elements => {
            for (i, v) in at.as_array().into_iter().flatten().enumerate() {
                pointer.push('/');
                pointer.push_str(&i.to_string());
                let name = ["name", "groupName"]
                    .iter()
                    .find_map(|k| v.get(k).and_then(Value::as_str))
                    .map_or_else(|| i.to_string(), str::to_owned);
                names.push(name);
                walk(rest, v, pointer, names, out);
                names.pop();
                pointer.truncate(len);
            }
        }
    }
    pointer.truncate(len);
}

/// A JSON pointer token: `~` and `/` escaped (RFC 6901).
fn push_token(pointer: &mut String, key: &str) {
    pointer.push('/');
    for c in key.chars() {
        match c {
            '~' => pointer.push_str("~0"),
            '/' => pointer.push_str("~1"),
            c => pointer.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn found(path: &str, v: &Value) -> Vec<(String, Vec<String>)> {
        Path::parse(path)
            .unwrap()
            .find(v)
            .into_iter()
            .map(|f| {
                assert_eq!(v.pointer(&f.pointer), Some(f.value));
                (f.pointer, f.names)
            })
            .collect()
    }

    #[test]
    fn keys_members_and_elements() {
        let v = json!({"spec": {
            "template": {"spec": {}},
            "pytorchReplicaSpecs": {"Master": {"template": {"a": 1}}, "Worker": {"template": {"b": 2}}},
            "replicatedJobs": [
                {"name": "workers", "template": {"spec": {"template": {"c": 3}}}},
                {"template": {"spec": {"template": {"d": 4}}}}
            ],
            "workerGroupSpecs": [{"groupName": "small", "template": {}}],
            "a/b": {"~t": {}}
        }});
        assert_eq!(
            found("spec.template", &v),
            [("/spec/template".to_owned(), vec![])]
        );
        assert_eq!(
            found("spec.pytorchReplicaSpecs.*.template", &v),
            [
                (
                    "/spec/pytorchReplicaSpecs/Master/template".to_owned(),
                    vec!["Master".to_owned()]
                ),
                (
                    "/spec/pytorchReplicaSpecs/Worker/template".to_owned(),
                    vec!["Worker".to_owned()]
                )
            ]
        );
        assert_eq!(
            found("spec.replicatedJobs[*].template.spec.template", &v),
            [
                (
                    "/spec/replicatedJobs/0/template/spec/template".to_owned(),
                    vec!["workers".to_owned()]
                ),
                (
                    "/spec/replicatedJobs/1/template/spec/template".to_owned(),
                    vec!["1".to_owned()]
                )
            ]
        );
        assert_eq!(
            found("spec.workerGroupSpecs[*].template", &v),
            [(
                "/spec/workerGroupSpecs/0/template".to_owned(),
                vec!["small".to_owned()]
            )]
        );
        assert_eq!(
            found("spec.a/b.~t", &v),
            [("/spec/a~1b/~0t".to_owned(), vec![])]
        );
    }

    #[test]
    fn what_is_absent_or_of_another_shape_finds_nothing() {
        let v = json!({"spec": {"tasks": {"x": 1}, "template": null, "m": [1]}});
        for p in [
            "spec.jobTemplate.spec.template",
            "spec.tasks[*].template",
            "spec.template",
            "spec.m.*",
            "status",
        ] {
            assert!(found(p, &v).is_empty(), "{p}");
        }
    }

    #[test]
    fn bad_paths_are_refused() {
        for p in [
            "",
            "spec..template",
            "spec.[*]",
            "spec.a[0]",
            "spec.a*",
            "*[*]",
        ] {
            assert!(Path::parse(p).is_err(), "{p}");
        }
    }
}
