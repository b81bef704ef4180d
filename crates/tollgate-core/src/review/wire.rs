//! The AdmissionReview written back, by hand (docs/architecture.md, "Decisions").

use super::Reviewed;

impl Reviewed {
    /// The AdmissionReview to send back, as JSON.
    ///
    /// Written out by hand rather than through kube's `into_review`: the patch goes as a
    /// base64 string (what Go's `[]byte` expects, a third the size of a number array),
    /// encoded straight into the output; audit annotations in a stable order; and no empty
    /// status on an allowed review.
    pub fn to_json(&self) -> Vec<u8> {
        use base64::Engine as _;
        let r = &self.response;
        let patch_len = r.patch.as_ref().map_or(0, |p| p.len().div_ceil(3) * 4);
        let mut out = Vec::with_capacity(192 + patch_len);
        out.extend_from_slice(
            br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"#,
        );
        // Writing strings, maps and a Status into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &r.uid);
        out.extend_from_slice(if r.allowed {
            b",\"allowed\":true"
        } else {
            b",\"allowed\":false"
        });
        if !r.allowed {
            out.extend_from_slice(b",\"status\":");
            let _ = serde_json::to_writer(&mut out, &r.result);
        }
        if let Some(patch) = &r.patch {
            out.extend_from_slice(b",\"patch\":\"");
            let at = out.len();
            out.resize(at + patch_len, 0);
            let n = base64::engine::general_purpose::STANDARD
                .encode_slice(patch, &mut out[at..])
                .unwrap_or(0);
            out.truncate(at + n);
            out.extend_from_slice(b"\",\"patchType\":\"JSONPatch\"");
        }
        if !r.audit_annotations.is_empty() {
            let sorted: std::collections::BTreeMap<_, _> = r.audit_annotations.iter().collect();
            out.extend_from_slice(b",\"auditAnnotations\":");
            let _ = serde_json::to_writer(&mut out, &sorted);
        }
        if let Some(w) = r.warnings.as_deref().filter(|w| !w.is_empty()) {
            out.extend_from_slice(b",\"warnings\":");
            let _ = serde_json::to_writer(&mut out, w);
        }
        out.extend_from_slice(b"}}");
        out
    }
}
