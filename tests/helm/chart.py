"""Lints and renders deploy/helm/tollgate with helm-python-sdk (Helm v4 as a library: no
helm binary), for tests/helm.rs.

Reads one JSON request on standard input:

    {"chart": PATH, "lint": [{"namespace": NS, "kube_version": "v1.29.0"}, ...],
     "cases": [{"name": NAME, "values": {...}, "namespace": NS}]}

and writes one JSON answer on standard output:

    {"sdk": {"helm_python": V, "helm": V},
     "lint": [{"total_charts_linted": N, "messages": [...], "errors": [...]}, ...],
     "cases": {NAME: {"manifests": {TEMPLATE: TEXT}} | {"error": MESSAGE}}}

A case's values are checked against values.schema.json by the render itself, as
`helm install` checks them: a wrong value is that case's error, naming the value.
"""

import json
import sys

try:
    import helm_python as helm
except ImportError as e:  # The Rust side says what to install.
    json.dump({"missing": str(e)}, sys.stdout)
    sys.exit(0)


def main() -> None:
    request = json.load(sys.stdin)
    chart_path = request["chart"]
    answer = {
        "sdk": {"helm_python": helm.__version__, "helm": helm.helm_sdk_version()},
        "cases": {},
    }
    answer["lint"] = [
        helm.lint(
            chart_path,
            strict=True,
            namespace=lint.get("namespace"),
            kube_version=lint.get("kube_version"),
        )
        for lint in request.get("lint", [])
    ]
    with helm.Chart.load(chart_path) as chart:
        answer["metadata"] = chart.metadata
        for case in request.get("cases", []):
            try:
                manifests = chart.render(
                    case.get("values", {}),
                    name=case.get("release", "tollgate"),
                    namespace=case.get("namespace", "tollgate-system"),
                    is_install=True,
                )
                answer["cases"][case["name"]] = {"manifests": manifests}
            except helm.HelmError as e:
                answer["cases"][case["name"]] = {"error": str(e)}
    json.dump(answer, sys.stdout)


if __name__ == "__main__":
    main()
