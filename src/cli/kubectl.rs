//! kubectl's habits, in one place for every command: the flags that find the cluster
//! (`--kubeconfig`, `--context`: [`ClusterFlags`], from `kubeconfig`), that choose namespaces (`-n`, `-A`), that name manifests
//! (`-f` repeated, positional files, `-k DIR`, `-R`), and how a command's output ends when
//! its reader goes away (`tollgate audit -o json | head`). A command flattens the groups it
//! takes (`#[command(flatten)]`), so that each flag means in tollgate what it means to
//! kubectl, and is spelled the same in every command.
//!
//! Where a command's `--namespace` already means something else (tollgate's own namespace,
//! for `export`, `register` and `certs`), it keeps it and says so in its help.

use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::Args;
use serde_json::Value;

/// `--kubeconfig` and `--context`, with the finding of the cluster they choose; kept with
/// it (`kubeconfig`), below `register` and the server, which take them too.
pub use crate::kubeconfig::ClusterFlags;

/// `-n` and `-A`: which namespaces a command reads of a live cluster.
#[derive(Args, Debug, Clone, Default)]
pub struct NamespaceFlags {
    /// The namespace [default: the kubeconfig context's namespace, else "default"].
    #[arg(
        short = 'n',
        long,
        value_name = "NS",
        conflicts_with = "all_namespaces"
    )]
    pub namespace: Option<String>,
    /// Every namespace.
    #[arg(short = 'A', long)]
    pub all_namespaces: bool,
}

/// `-f`, `-k` and `-R`: the manifests a command reads, as `kubectl apply` takes them.
#[derive(Args, Debug, Clone, Default)]
pub struct Manifests {
    /// A file, a directory of .yaml, .yml and .json files, or "-" for standard input
    /// (repeatable).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub filenames: Vec<String>,
    /// A kustomization directory, built as `kubectl kustomize DIR` builds it (kubectl must
    /// be on PATH; repeatable).
    #[arg(short = 'k', long = "kustomize", value_name = "DIR")]
    pub kustomize: Vec<PathBuf>,
    /// With a directory: its subdirectories too.
    #[arg(short = 'R', long)]
    pub recursive: bool,
}

/// One input's text: a file, standard input, or a kustomization's build.
#[derive(Debug, Clone)]
pub struct Text {
    /// How messages name it: the path, `standard input`, `kustomize DIR`.
    pub name: String,
    pub text: String,
    /// Found by walking a directory rather than named: a file there that is not a
    /// manifest (a Helm template, a README in YAML) is listed, never fatal.
    pub in_directory: bool,
}

impl Manifests {
    /// Whether no manifest was named (with `also`, a command's positional files).
    pub fn is_empty(&self, also: &[String]) -> bool {
        self.filenames.is_empty() && self.kustomize.is_empty() && also.is_empty()
    }

    /// The texts of `also` (a command's positional files) and then of `-f` and `-k`, in
    /// order; an error is the one line to show.
    pub fn texts(&self, also: &[String]) -> Result<Vec<Text>, String> {
        let mut out = vec![];
        for name in also.iter().chain(&self.filenames) {
            if name == "-" {
                let mut text = String::new();
                std::io::stdin()
                    .read_to_string(&mut text)
                    .map_err(|e| format!("standard input: {e}"))?;
                out.push(Text {
                    name: "standard input".into(),
                    text,
                    in_directory: false,
                });
                continue;
            }
            let path = Path::new(name);
            let found = read_paths(path, self.recursive)?;
            if found.is_empty() && path.is_dir() {
                let hint = if self.recursive {
                    ""
                } else {
                    " (-R looks in subdirectories)"
                };
                return Err(format!("{name}: no .yaml, .yml or .json file{hint}"));
            }
            out.extend(found);
        }
        for dir in &self.kustomize {
            out.push(Text {
                name: format!("kustomize {}", dir.display()),
                text: kustomize(dir)?,
                in_directory: false,
            });
        }
        Ok(out)
    }
}

/// The text of a file, or of each manifest file of a directory ([`manifest_files`]), with
/// its path; an error is the one line to show.
pub fn read_paths(path: &Path, recursive: bool) -> Result<Vec<Text>, String> {
    let read = |p: &Path, in_directory: bool| {
        let name = p.display().to_string();
        std::fs::read_to_string(p)
            .map(|text| Text {
                name: name.clone(),
                text,
                in_directory,
            })
            .map_err(|e| format!("{name}: {e}"))
    };
    if !path.is_dir() {
        return Ok(vec![read(path, false)?]);
    }
    let mut files = vec![];
    manifest_files(path, recursive, &mut files).map_err(|e| format!("{}: {e}", path.display()))?;
    files.iter().map(|f| read(f, true)).collect()
}

/// The `.yaml`, `.yml` and `.json` files of `dir`, sorted by path; those of its
/// subdirectories too when `recursive`.
pub fn manifest_files(dir: &Path, recursive: bool, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    entries.sort();
    for p in entries {
        if p.is_dir() {
            if recursive {
                manifest_files(&p, recursive, out)?;
            }
        } else if p
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
        {
            out.push(p);
        }
    }
    Ok(())
}

/// `kubectl kustomize DIR`'s output: the kustomization built exactly as kubectl builds it
/// for `kubectl apply -k` (its own kustomize, its own plugins and load restrictions), rather
/// than an imitation that would differ on some field.
pub fn kustomize(dir: &Path) -> Result<String, String> {
    let shown = dir.display();
    let out = match Command::new("kubectl").arg("kustomize").arg(dir).output() {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "-k {shown}: building a kustomization needs kubectl on PATH (tollgate runs \
                 `kubectl kustomize {shown}`), and there is none; install kubectl, or build it \
                 yourself: `kubectl kustomize {shown} | tollgate review -`"
            ))
        }
        Err(e) => return Err(format!("-k {shown}: running kubectl kustomize: {e}")),
    };
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        return Err(format!("-k {shown}: kubectl kustomize: {}", said(&err)));
    }
    String::from_utf8(out.stdout).map_err(|e| format!("-k {shown}: kubectl kustomize: {e}"))
}

/// What kubectl said on standard error, in its words: the `err="..."` of a klog line
/// (`E1203 ... "command failed" err="must build at directory: ..."`), else its last line
/// without `error: `.
fn said(stderr: &str) -> String {
    let last = stderr
        .lines()
        .rfind(|l| !l.trim().is_empty())
        .unwrap_or("")
        .trim();
    if let Some((_, err)) = last.split_once(" err=\"") {
        return err.strip_suffix('"').unwrap_or(err).replace("\\\"", "\"");
    }
    last.trim_start_matches("error: ").to_owned()
}

/// A document of an input, numbered within its file as kubectl numbers them.
#[derive(Debug, Clone)]
pub struct Document {
    pub file: String,
    /// From 1, within its file (a `kind: List`'s items share its number).
    pub number: usize,
    pub value: Value,
}

impl Document {
    /// `a.yaml: document 3`: where a message about it points.
    pub fn place(&self) -> String {
        format!("{}: document {}", self.file, self.number)
    }

    /// Why this is not a Kubernetes object, if it is not: a document without apiVersion
    /// and kind (a Helm values file, a kustomization written without them), or a
    /// kustomization, which names objects rather than being one.
    pub fn not_an_object(&self) -> Option<String> {
        let field = |f: &str| self.value.get(f).and_then(Value::as_str).unwrap_or("");
        let (api, kind) = (field("apiVersion"), field("kind"));
        let kustomization = api.starts_with("kustomize.config.k8s.io/")
            || (kind.is_empty()
                && ["resources", "bases", "patches", "namePrefix"]
                    .iter()
                    .any(|k| self.value.get(k).is_some()));
        if kustomization {
            return Some(
                "a kustomization, not an object: review what it builds with -k DIR".into(),
            );
        }
        match (api.is_empty(), kind.is_empty()) {
            (false, false) => None,
            (true, true) => Some(
                "not a Kubernetes object (no apiVersion and kind): a values file or other \
                 configuration, left out"
                    .into(),
            ),
            (true, false) => Some(format!(
                "a {kind} without apiVersion: not an object kubectl would apply"
            )),
            (false, true) => Some(format!(
                "no kind ({api}): not an object kubectl would apply"
            )),
        }
    }
}

/// How a kind is named to a person (`job`, `job.batch.volcano.sh`): the engine's
/// [`tollgate_core::kind_noun`], from an object's apiVersion.
pub fn kind_noun(api_version: &str, kind: &str) -> String {
    let group = api_version.rsplit_once('/').map_or("", |(g, _)| g);
    tollgate_core::kind_noun(group, kind)
}

/// What a command writes to standard output, written. A reader that went away (`| head`)
/// took what it wanted: that ends it quietly, no failure. False: it could not be written
/// (said on standard error).
pub fn print(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => true,
        Err(e) if closed(&e) => true,
        Err(e) => {
            eprintln!("tollgate: writing to standard output: {e}");
            false
        }
    }
}

/// Whether an error writing output is its reader having gone away: then there is no one
/// to tell, and the command ends quietly, as kubectl does under `| head`.
pub fn closed(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::BrokenPipe
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(v: Value) -> Document {
        Document {
            file: "a.yaml".into(),
            number: 3,
            value: v,
        }
    }

    #[test]
    fn objects_and_what_is_not_one() {
        let pod = doc(serde_json::json!({"apiVersion": "v1", "kind": "Pod"}));
        assert_eq!(pod.not_an_object(), None);
        assert_eq!(pod.place(), "a.yaml: document 3");
        let values = doc(serde_json::json!({"replicaCount": 2, "image": {"tag": "x"}}));
        assert!(values
            .not_an_object()
            .unwrap()
            .contains("no apiVersion and kind"));
        let k = doc(serde_json::json!({"resources": ["job.yaml"]}));
        assert!(k.not_an_object().unwrap().contains("kustomization"));
        let k = doc(serde_json::json!({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization"
        }));
        assert!(k.not_an_object().unwrap().contains("-k DIR"));
    }

    #[test]
    fn kinds_are_named_from_their_api_version() {
        assert_eq!(kind_noun("batch/v1", "Job"), "job");
        assert_eq!(
            kind_noun("batch.volcano.sh/v1alpha1", "Job"),
            "job.batch.volcano.sh"
        );
        assert_eq!(kind_noun("v1", "Pod"), "pod");
    }

    #[test]
    fn kubectls_words_without_its_log_prefix() {
        let klog = "E1203 18:50:39.328598   20083 run.go:72] \"command failed\" err=\"must build at directory: not a valid directory\"\n";
        assert_eq!(said(klog), "must build at directory: not a valid directory");
        assert_eq!(
            said("error: accumulating resources: x\n"),
            "accumulating resources: x"
        );
    }

    #[test]
    fn a_missing_kustomization_directory_is_said() {
        let err = kustomize(Path::new("/nonexistent/tollgate-k")).unwrap_err();
        assert!(err.starts_with("-k /nonexistent/tollgate-k: "), "{err}");
    }
}
