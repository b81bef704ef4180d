"""Installs or uninstalls deploy/helm/tollgate in a real apiserver with helm-python-sdk
(Helm v4 as a library, `Config.install` / `Config.uninstall`), for tests/helm.rs.

Reads one JSON request on standard input:

    {"action": "install" | "uninstall", "chart": PATH, "kubeconfig": PATH,
     "release": NAME, "namespace": NS, "values": {...}}

and writes one JSON answer on standard output: {"manifest": TEXT} (the release's
manifest, as Helm stored it) for an install, {} for an uninstall, or {"error": MESSAGE}.
"""

import json
import sys

try:
    import helm_python as helm
except ImportError as e:  # The Rust side says what to install.
    json.dump({"missing": str(e)}, sys.stdout)
    sys.exit(0)


def main() -> None:
    r = json.load(sys.stdin)
    config = helm.Config(kubeconfig_path=r["kubeconfig"], namespace=r["namespace"])
    try:
        if r["action"] == "install":
            release = config.install(
                r["chart"], r["release"], r.get("values", {}), namespace=r["namespace"], timeout=60
            )
            manifest = release["manifest"] if isinstance(release, dict) else release.manifest
            json.dump({"manifest": manifest}, sys.stdout)
        else:
            config.uninstall(r["release"], ignore_not_found=True, timeout=60)
            json.dump({}, sys.stdout)
    except helm.HelmError as e:
        json.dump({"error": str(e)}, sys.stdout)
    finally:
        config.close()


if __name__ == "__main__":
    main()
