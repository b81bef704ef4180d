//! The apiserver stand-in held to the real protocol by kube-rs itself: its client, `Api`,
//! `runtime::watcher` and `reflector` run against it unchanged, so what the shell's
//! cluster-reading code does against it is what it does against a cluster.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{reflector, watcher, WatchStreamExt as _};
use kube::ResourceExt as _;
use serde_json::{json, Value};
use tollgate_apiserver_standin::{ApiServer, Fault, ResourceType, Verb};

fn pod(ns: &str, name: &str, labels: Value) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": ns, "name": name, "labels": labels},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    })
}

fn api_error(err: kube::Error) -> Box<kube::core::Status> {
    match err {
        kube::Error::Api(s) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Polls `f` until it holds, for up to 5 s.
async fn eventually(what: &str, f: impl Fn() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Ends a watcher's task while the server still answers, and waits until it has ended.
/// Aborting is not enough: a task mid-poll when the server stops meets a refused
/// connection, and kube's watcher without a backoff retries that at once, so the task
/// never yields again, never sees its abort, and the runtime's shutdown at the test's end
/// waits on it for good (a CI run hung so, under load).
async fn stop(task: tokio::task::JoinHandle<()>) {
    task.abort();
    let _ = task.await;
}

fn store_names(store: &reflector::Store<Pod>) -> BTreeSet<String> {
    store
        .state()
        .iter()
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect()
}

fn server_names(server: &ApiServer) -> BTreeSet<String> {
    server
        .objects("pods")
        .iter()
        .map(|p| {
            format!(
                "{}/{}",
                p["metadata"]["namespace"].as_str().unwrap(),
                p["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_pages_follow_continue_from_one_snapshot_and_expire_after_compaction() {
    let server = ApiServer::start().await;
    // "alpha-x" sorts before "alpha/": keys sort as etcd's do, as strings.
    let namespaces = ["alpha", "alpha-x", "beta"];
    server.insert_many(
        "pods",
        namespaces.iter().flat_map(|ns| {
            (0..350).map(move |i| pod(ns, &format!("pod-{i:04}"), json!({"i": i.to_string()})))
        }),
    );
    let mut expected: Vec<String> = namespaces
        .iter()
        .flat_map(|ns| (0..350).map(move |i| format!("{ns}/pod-{i:04}")))
        .collect();
    expected.sort();
    assert_eq!(expected[0], "alpha-x/pod-0000");

    let api: Api<Pod> = Api::all(server.client());
    let mut seen = Vec::new();
    let mut token: Option<String> = None;
    let mut pages = 0;
    let mut list_rv = None;
    loop {
        let mut lp = ListParams::default().limit(100);
        if let Some(t) = &token {
            lp = lp.continue_token(t);
        }
        let page = api.list(&lp).await.unwrap();
        pages += 1;
        if pages == 1 {
            assert_eq!(page.metadata.remaining_item_count, Some(950));
            // Writes after the first page are not in the later ones: one snapshot.
            server.insert("pods", pod("beta", "pod-9999", json!({})));
            server.modify("pods", Some("beta"), "pod-0001", |p| {
                p["metadata"]["labels"]["changed"] = json!("yes");
            });
            server.remove("pods", Some("beta"), "pod-0002");
        }
        let rv = page.metadata.resource_version.clone().unwrap();
        assert_eq!(
            *list_rv.get_or_insert(rv.clone()),
            rv,
            "every page at one revision"
        );
        for p in &page.items {
            assert!(p.labels().get("changed").is_none(), "{:?}", p.metadata);
            seen.push(format!("{}/{}", p.namespace().unwrap(), p.name_any()));
        }
        token = page.metadata.continue_.filter(|t| !t.is_empty());
        if token.is_none() {
            break;
        }
    }
    assert_eq!(pages, 11);
    assert_eq!(seen, expected, "each pod once, in key order");
    assert_eq!(server.count(Verb::List, "pods"), 11);

    // One namespace: its own key range.
    let beta: Api<Pod> = Api::namespaced(server.client(), "beta");
    let all = beta.list(&ListParams::default()).await.unwrap();
    assert_eq!(all.items.len(), 350, "pod-9999 added, pod-0002 removed");
    assert!(all
        .items
        .iter()
        .all(|p| p.namespace().as_deref() == Some("beta")));

    // After a compaction the token is too old: 410 Expired, with a token to go on from.
    let first = api.list(&ListParams::default().limit(100)).await.unwrap();
    server.compact();
    let err = api
        .list(
            &ListParams::default()
                .limit(100)
                .continue_token(first.metadata.continue_.as_deref().unwrap()),
        )
        .await
        .unwrap_err();
    let status = api_error(err);
    assert_eq!(status.code, 410);
    assert_eq!(status.reason, "Expired");
    assert!(
        status.message.starts_with(
            "The provided continue parameter is too old to display a consistent list result."
        ),
        "{}",
        status.message
    );
    let fresh = status.metadata.and_then(|m| m.continue_).unwrap();
    let rest = api
        .list(&ListParams::default().limit(1000).continue_token(&fresh))
        .await
        .unwrap();
    assert_eq!(
        rest.items.len(),
        950,
        "the remainder, at the latest revision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflector_follows_live_events_broken_watches_and_relists_after_410() {
    let server = ApiServer::builder()
        .resources(ResourceType::defaults())
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await;
    server.insert_many(
        "pods",
        (0..10).map(|i| pod("ml", &format!("p{i}"), json!({"app": "train"}))),
    );
    let api: Api<Pod> = Api::all(server.client());
    let (reader, writer) = reflector::store();
    let stream = reflector(writer, watcher(api, watcher::Config::default()));
    let errors = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let errs = errors.clone();
    let task = tokio::spawn(stream.for_each(move |ev| {
        if let Err(e) = ev {
            errs.lock().unwrap().push(e.to_string());
        }
        async {}
    }));
    tokio::time::timeout(Duration::from_secs(5), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 10);
    let first_list = &server.requests_for(Verb::List, "pods")[0];
    assert_eq!(first_list.param("limit").as_deref(), Some("500"));

    // Live events.
    server.insert("pods", pod("ml", "new", json!({})));
    eventually("ADDED", || reader.state().len() == 11).await;
    server.modify("pods", Some("ml"), "p0", |p| {
        p["metadata"]["labels"]["phase"] = json!("two");
    });
    eventually("MODIFIED", || {
        reader.state().iter().any(|p| {
            p.name_any() == "p0" && p.labels().get("phase").map(String::as_str) == Some("two")
        })
    })
    .await;
    server.remove("pods", Some("ml"), "p1");
    eventually("DELETED", || reader.state().len() == 10).await;

    // Bookmarks carry the watcher past writes to other resources: its next watch starts
    // from a bookmark's revision, not its last pod's.
    assert!(server.wait_for_watches(1, Duration::from_secs(5)).await);
    server.insert(
        "secrets",
        json!({"metadata": {"namespace": "ml", "name": "unrelated"}}),
    );
    let bumped = server.resource_version();
    tokio::time::sleep(Duration::from_millis(400)).await;

    // A lost connection: the watcher resumes where it was, without listing again.
    assert!(server.break_watches() >= 1);
    server.insert("pods", pod("ml", "while-broken", json!({})));
    eventually("recovered after a broken watch", || {
        store_names(&reader) == server_names(&server)
    })
    .await;
    assert_eq!(server.count(Verb::List, "pods"), 1);
    let watches = server.requests_for(Verb::Watch, "pods");
    assert!(watches.len() >= 2, "{watches:?}");
    let resumed: u64 = watches[1]
        .param("resourceVersion")
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        resumed >= bumped,
        "resumed at {resumed}, a bookmark said {bumped}"
    );
    assert_eq!(
        watches[1].param("allowWatchBookmarks").as_deref(),
        Some("true")
    );

    // Compaction then a lost connection: the re-watch gets 410 and the watcher lists again.
    assert!(server.wait_for_watches(1, Duration::from_secs(5)).await);
    server.compact();
    server.break_watches();
    server.remove("pods", Some("ml"), "p2");
    server.insert("pods", pod("ml", "after-compaction", json!({})));
    eventually("a second LIST", || server.count(Verb::List, "pods") == 2).await;
    eventually("converged after the re-list", || {
        store_names(&reader) == server_names(&server)
    })
    .await;
    // kube takes a watch cut mid-stream for a resumable end, not an error (the cut itself
    // is checked in `watch_responses_are_chunked_json_lines_and_breaks_cut_them`); the 410 is one.
    let errors = errors.lock().unwrap().clone();
    assert!(
        errors
            .iter()
            .any(|e| e.contains("too old resource version")),
        "{errors:?}"
    );
    stop(task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_create_replace_patch_delete_answer_as_the_real_server() {
    let server = ApiServer::start().await;
    let pods: Api<Pod> = Api::namespaced(server.client(), "default");

    let status = api_error(pods.get("missing").await.unwrap_err());
    assert_eq!(status.code, 404);
    assert_eq!(status.reason, "NotFound");
    assert_eq!(status.message, "pods \"missing\" not found");
    assert!(pods.get_opt("missing").await.unwrap().is_none());

    let p: Pod = serde_json::from_value(pod("default", "web", json!({"app": "web"}))).unwrap();
    let created = pods.create(&PostParams::default(), &p).await.unwrap();
    assert!(created.metadata.uid.is_some());
    assert!(created.metadata.creation_timestamp.is_some());
    let rv1: u64 = created.resource_version().unwrap().parse().unwrap();
    let status = api_error(pods.create(&PostParams::default(), &p).await.unwrap_err());
    assert_eq!(
        (status.code, status.reason.as_str()),
        (409, "AlreadyExists")
    );

    // generateName.
    let mut g = p.clone();
    g.metadata.name = None;
    g.metadata.generate_name = Some("web-".into());
    let generated = pods.create(&PostParams::default(), &g).await.unwrap();
    let name = generated.name_any();
    assert!(name.starts_with("web-") && name.len() == 9, "{name}");

    // Replace with the stored resourceVersion, then with a stale one.
    let mut changed = created.clone();
    changed.labels_mut().insert("v".into(), "2".into());
    let replaced = pods
        .replace("web", &PostParams::default(), &changed)
        .await
        .unwrap();
    let rv2: u64 = replaced.resource_version().unwrap().parse().unwrap();
    assert!(rv2 > rv1);
    assert_eq!(replaced.metadata.uid, created.metadata.uid);
    let status = api_error(
        pods.replace("web", &PostParams::default(), &changed)
            .await
            .unwrap_err(),
    );
    assert_eq!((status.code, status.reason.as_str()), (409, "Conflict"));
    assert!(
        status.message.contains("the object has been modified"),
        "{}",
        status.message
    );

    // Patches: merge, JSON; apply is refused.
    let merged = pods
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"merged": "yes", "v": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        merged.labels().get("merged").map(String::as_str),
        Some("yes")
    );
    assert!(merged.labels().get("v").is_none());
    let ops: json_patch::Patch = serde_json::from_value(json!([
        {"op": "add", "path": "/metadata/annotations", "value": {"a": "b"}}
    ]))
    .unwrap();
    let patched = pods
        .patch("web", &PatchParams::default(), &Patch::Json::<()>(ops))
        .await
        .unwrap();
    assert_eq!(
        patched.annotations().get("a").map(String::as_str),
        Some("b")
    );
    let status = api_error(
        pods.patch("web", &PatchParams::apply("t"), &Patch::Apply(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 415);

    // Delete answers with the object; then it is gone.
    let deleted = pods.delete("web", &DeleteParams::default()).await.unwrap();
    assert_eq!(deleted.left().map(|p| p.name_any()).as_deref(), Some("web"));
    assert_eq!(api_error(pods.get("web").await.unwrap_err()).code, 404);
    assert_eq!(
        api_error(
            pods.delete("web", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .code,
        404
    );

    // A Lease, as leader election uses one.
    let leases: Api<Lease> = Api::namespaced(server.client(), "tollgate");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "tollgate-leader"},
        "spec": {"holderIdentity": "pod-a", "leaseDurationSeconds": 15,
                 "acquireTime": "2026-01-01T00:00:00.000000Z", "renewTime": "2026-01-01T00:00:00.000000Z"},
    }))
    .unwrap();
    let held = leases.create(&PostParams::default(), &lease).await.unwrap();
    let got = leases.get("tollgate-leader").await.unwrap();
    assert_eq!(
        got.spec.as_ref().unwrap().holder_identity.as_deref(),
        Some("pod-a")
    );
    assert_eq!(got.metadata.namespace.as_deref(), Some("tollgate"));
    let mut renewed = got.clone();
    renewed.spec.as_mut().unwrap().renew_time =
        Some(serde_json::from_value(json!("2026-01-01T00:00:10.000000Z")).unwrap());
    let renewed = leases
        .replace("tollgate-leader", &PostParams::default(), &renewed)
        .await
        .unwrap();
    assert_ne!(renewed.resource_version(), held.resource_version());
    let mut stolen = held.clone();
    stolen.spec.as_mut().unwrap().holder_identity = Some("pod-b".into());
    let status = api_error(
        leases
            .replace("tollgate-leader", &PostParams::default(), &stolen)
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code, 409);
    assert_eq!(
        status.message,
        "Operation cannot be fulfilled on leases.coordination.k8s.io \"tollgate-leader\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // A replace that changes nothing takes no new revision, as the real server's.
    let same = leases
        .replace("tollgate-leader", &PostParams::default(), &renewed)
        .await
        .unwrap();
    assert_eq!(same.resource_version(), renewed.resource_version());

    // A cluster-scoped resource.
    let namespaces: Api<Namespace> = Api::all(server.client());
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "ml"}})).unwrap();
    namespaces
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let got = namespaces.get("ml").await.unwrap();
    assert_eq!(got.metadata.namespace, None);
    assert_eq!(
        namespaces
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len(),
        1
    );

    // Finalizers hold a deletion until they are removed.
    server.insert(
        "secrets",
        json!({"metadata": {"namespace": "default", "name": "held", "finalizers": ["x/y"]}}),
    );
    let secrets: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(server.client(), "default");
    secrets
        .delete("held", &DeleteParams::default())
        .await
        .unwrap();
    let held = secrets.get("held").await.unwrap();
    assert!(held.metadata.deletion_timestamp.is_some());
    secrets
        .patch(
            "held",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert!(secrets.get_opt("held").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_and_field_selectors_filter_lists_and_watches() {
    let server = ApiServer::start().await;
    server.insert_many(
        "pods",
        [
            pod("a", "p1", json!({"app": "train", "tier": "gpu"})),
            pod("a", "p2", json!({"app": "train"})),
            pod("a", "p3", json!({"app": "serve", "tier": "cpu"})),
            pod("b", "p4", json!({"app": "serve", "rank": "3"})),
            pod("b", "p5", json!({})),
        ],
    );
    let api: Api<Pod> = Api::all(server.client());
    let names = |lp: ListParams| {
        let api = api.clone();
        async move {
            api.list(&lp)
                .await
                .unwrap()
                .items
                .iter()
                .map(|p| p.name_any())
                .collect::<Vec<_>>()
                .join(",")
        }
    };
    let labels = |s: &str| ListParams::default().labels(s);
    let fields = |s: &str| ListParams::default().fields(s);
    assert_eq!(names(labels("app=train")).await, "p1,p2");
    assert_eq!(names(labels("app==serve")).await, "p3,p4");
    assert_eq!(names(labels("app!=train")).await, "p3,p4,p5");
    assert_eq!(names(labels("app in (train, serve)")).await, "p1,p2,p3,p4");
    assert_eq!(names(labels("app notin (train)")).await, "p3,p4,p5");
    assert_eq!(names(labels("tier")).await, "p1,p3");
    assert_eq!(names(labels("!tier")).await, "p2,p4,p5");
    assert_eq!(names(labels("app=train,tier")).await, "p1");
    assert_eq!(names(labels("rank>2")).await, "p4");
    assert_eq!(names(fields("metadata.name=p3")).await, "p3");
    assert_eq!(names(fields("metadata.namespace!=a")).await, "p4,p5");
    assert_eq!(
        names(fields("metadata.namespace=a,metadata.name!=p1")).await,
        "p2,p3"
    );
    assert_eq!(names(fields("spec.nodeName=")).await, "p1,p2,p3,p4,p5");
    // A selector on every page: `limit` counts what matched.
    assert_eq!(names(labels("app=train").limit(1)).await, "p1");

    let status = api_error(api.list(&labels("app in (a")).await.unwrap_err());
    assert_eq!(status.code, 400);
    let status = api_error(api.list(&fields("spec.image=x")).await.unwrap_err());
    assert_eq!(
        (status.code, status.message.as_str()),
        (400, "field label not supported: spec.image")
    );

    // A raw watch with a selector: what enters the selection is ADDED, what leaves it
    // DELETED, what never matched is not seen.
    let rv = api
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut events = api
        .watch(&WatchParams::default().labels("app=train"), &rv)
        .await
        .unwrap()
        .boxed();
    server.modify("pods", Some("b"), "p5", |p| {
        p["metadata"]["labels"]["app"] = json!("train")
    });
    server.modify("pods", Some("b"), "p4", |p| {
        p["metadata"]["labels"]["x"] = json!("y")
    });
    server.modify("pods", Some("a"), "p1", |p| {
        p["metadata"]["labels"]["x"] = json!("y")
    });
    server.modify("pods", Some("a"), "p2", |p| {
        p["metadata"]["labels"]["app"] = json!("done")
    });
    let mut got = Vec::new();
    while got.len() < 3 {
        match tokio::time::timeout(Duration::from_secs(5), events.try_next())
            .await
            .unwrap()
            .unwrap()
        {
            Some(WatchEvent::Added(p)) => got.push(format!("ADDED {}", p.name_any())),
            Some(WatchEvent::Modified(p)) => got.push(format!("MODIFIED {}", p.name_any())),
            Some(WatchEvent::Deleted(p)) => got.push(format!("DELETED {}", p.name_any())),
            Some(WatchEvent::Bookmark(_)) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, ["ADDED p5", "MODIFIED p1", "DELETED p2"]);

    // And a reflector with a selector holds only what matches.
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().labels("tier")),
    );
    let task = tokio::spawn(stream.applied_objects().for_each(|_| async {}));
    reader.wait_until_ready().await.unwrap();
    let mut held: Vec<String> = reader.state().iter().map(|p| p.name_any()).collect();
    held.sort();
    assert_eq!(held, ["p1", "p3"]);
    stop(task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_faults_and_missing_tokens_surface_as_api_errors() {
    let server = ApiServer::start().await;
    server.insert("pods", pod("default", "p", json!({})));
    let api: Api<Pod> = Api::all(server.client());

    server.inject(Fault::status(403).on("pods", Verb::List).times(1));
    let status = api_error(api.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));
    assert!(
        status.message.contains("cannot list resource \"pods\""),
        "{}",
        status.message
    );
    assert_eq!(
        api.list(&ListParams::default()).await.unwrap().items.len(),
        1
    );

    let ns: Api<Pod> = Api::namespaced(server.client(), "default");
    server.inject(Fault::status(500).on("pods", Verb::Get));
    assert_eq!(api_error(ns.get("p").await.unwrap_err()).code, 500);
    assert_eq!(api_error(ns.get("p").await.unwrap_err()).code, 500);
    server.clear_faults();
    server.inject(
        Fault::delay(Duration::from_millis(300))
            .on("pods", Verb::Get)
            .times(1),
    );
    let t = Instant::now();
    ns.get("p").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    // 429 with Retry-After: kube's client retries it by itself.
    server.inject(
        Fault::status(429)
            .retry_after(0)
            .on("pods", Verb::Get)
            .times(1),
    );
    ns.get("p").await.unwrap();
    assert_eq!(server.count(Verb::Get, "pods"), 5);

    let mut config = server.kubeconfig();
    config.auth_info = Default::default();
    let anonymous: Api<Pod> = Api::all(kube::Client::try_from(config).unwrap());
    let status = api_error(anonymous.list(&ListParams::default()).await.unwrap_err());
    assert_eq!((status.code, status.reason.as_str()), (401, "Unauthorized"));

    let unknown = api_error(
        server
            .client()
            .request::<Value>(http_get("/apis/example.com/v1/widgets"))
            .await
            .unwrap_err(),
    );
    assert_eq!((unknown.code, unknown.reason.as_str()), (404, "NotFound"));
}

fn http_get(path: &str) -> hyper::Request<Vec<u8>> {
    hyper::Request::get(path).body(Vec::new()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watches_send_bookmarks_end_at_their_timeout_and_expire_old_versions() {
    let server = ApiServer::builder()
        .resources(ResourceType::defaults())
        .bookmark_interval(Duration::from_millis(100))
        .history_size(5)
        .start()
        .await;
    let api: Api<Pod> = Api::all(server.client());
    let start = server.insert("pods", pod("a", "p0", json!({})));
    let start_rv = start["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();

    // Bookmarks, then a clean end after timeoutSeconds.
    let t = Instant::now();
    let events: Vec<_> = api
        .watch(&WatchParams::default().timeout(1), &start_rv)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    assert!(t.elapsed() >= Duration::from_secs(1));
    assert!(t.elapsed() < Duration::from_secs(3));
    let bookmarks = events
        .iter()
        .filter_map(|e| match e {
            WatchEvent::Bookmark(b) => Some(b),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert!(bookmarks.len() >= 5, "{events:?}");
    assert_eq!(bookmarks[0].types.kind, "Pod");
    assert_eq!(bookmarks[0].metadata.resource_version, start_rv);

    // Past the history kept, a watch gets one 410 ERROR event, then the stream ends.
    for i in 1..=6 {
        server.insert("pods", pod("a", &format!("p{i}"), json!({})));
    }
    let events: Vec<_> = api
        .watch(&WatchParams::default(), &start_rv)
        .await
        .unwrap()
        .try_collect()
        .await
        .unwrap();
    let [WatchEvent::Error(status)] = events.as_slice() else {
        panic!("{events:?}")
    };
    assert_eq!((status.code, status.reason.as_str()), (410, "Expired"));
    let floor = server.resource_version() - 5;
    assert_eq!(
        status.message,
        format!("too old resource version: {start_rv} ({floor})")
    );

    // From within the history: exactly the changes after it.
    let from = (floor + 2).to_string();
    let mut stream = api
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    for want in ["p4", "p5", "p6"] {
        match stream.try_next().await.unwrap() {
            Some(WatchEvent::Added(p)) => assert_eq!(p.name_any(), want),
            other => panic!("{other:?}"),
        }
    }

    // A watch from "0": the current state as synthetic ADDED events.
    let mut stream = api
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let mut added = 0;
    while added < 7 {
        match stream.try_next().await.unwrap() {
            Some(WatchEvent::Added(_)) => added += 1,
            other => panic!("{other:?}"),
        }
    }

    // kube's streaming-list mode (sendInitialEvents) works too.
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(api.clone(), watcher::Config::default().streaming_lists()),
    );
    let task = tokio::spawn(stream.applied_objects().for_each(|_| async {}));
    tokio::time::timeout(Duration::from_secs(5), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 7);
    assert_eq!(server.count(Verb::List, "pods"), 0);
    stop(task).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_thousand_pods_list_in_pages_of_500() {
    let server = ApiServer::start().await;
    let t = Instant::now();
    let pods: Vec<Value> = (0..50_000)
        .map(|i| {
            pod(
                &format!("ns-{:02}", i % 50),
                &format!("pod-{i:05}"),
                json!({"app": "train"}),
            )
        })
        .collect();
    let built = t.elapsed();
    let t = Instant::now();
    server.insert_many("pods", pods);
    let seeded = t.elapsed();

    let api: Api<Pod> = Api::all(server.client());
    let t = Instant::now();
    let mut count = 0;
    let mut lp = ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await.unwrap();
        count += page.items.len();
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(c) => lp = lp.continue_token(&c),
            None => break,
        }
    }
    let listed = t.elapsed();
    eprintln!("50,000 pods: built in {built:?}, seeded in {seeded:?}, listed in {listed:?}");
    assert_eq!(count, 50_000);
    assert_eq!(server.count(Verb::List, "pods"), 100);
    assert!(listed < Duration::from_secs(30), "{listed:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kubeconfig_file_points_kube_at_the_stand_in() {
    let server = ApiServer::start().await;
    server.insert("namespaces", json!({"metadata": {"name": "ml"}}));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("kubeconfig");
    server.write_kubeconfig(&path).unwrap();

    let kubeconfig = kube::config::Kubeconfig::read_from(&path).unwrap();
    assert_eq!(kubeconfig.current_context.as_deref(), Some("standin"));
    let config = kube::Config::from_custom_kubeconfig(
        kubeconfig,
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    let client = kube::Client::try_from(config).unwrap();
    let version = client.apiserver_version().await.unwrap();
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "36")
    );
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let list = namespaces.list(&ListParams::default()).await.unwrap();
    assert_eq!(list.items[0].name_any(), "ml");

    server.shutdown().await;
    let err = namespaces.list(&ListParams::default()).await.unwrap_err();
    assert!(!matches!(err, kube::Error::Api(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_responses_are_chunked_json_lines_and_breaks_cut_them() {
    use http_body_util::BodyExt as _;
    let server = ApiServer::builder()
        .resources(ResourceType::defaults())
        .bookmark_interval(Duration::from_millis(100))
        .start()
        .await;
    server.insert("pods", pod("a", "p", json!({})));
    let client = server.client();
    let get = |q: &str| {
        hyper::Request::get(format!("/api/v1/pods?{q}"))
            .body(kube::client::Body::from(Vec::new()))
            .unwrap()
    };

    let res = client
        .send(get(
            "watch=1&resourceVersion=0&allowWatchBookmarks=true&timeoutSeconds=1",
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/json");
    assert_eq!(res.headers()["transfer-encoding"], "chunked");
    let body = res
        .into_body()
        .collect()
        .await
        .expect("a clean end")
        .to_bytes();
    let lines: Vec<Value> = std::str::from_utf8(&body)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "ADDED");
    assert_eq!(lines[0]["object"]["kind"], "Pod");
    assert_eq!(lines[0]["object"]["apiVersion"], "v1");
    assert_eq!(lines[1]["type"], "BOOKMARK");
    assert_eq!(
        lines[1]["object"],
        json!({"kind": "Pod", "apiVersion": "v1", "metadata": {"resourceVersion": server.resource_version().to_string()}})
    );

    let res = client
        .send(get("watch=true&resourceVersion=0"))
        .await
        .unwrap();
    assert!(server.wait_for_watches(1, Duration::from_secs(5)).await);
    assert_eq!(server.break_watches(), 1);
    assert!(res.into_body().collect().await.is_err(), "cut mid-stream");
    eventually("the watch closed", || server.open_watches() == 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_and_status_bodies_have_the_real_shapes() {
    let server = ApiServer::start().await;
    server.insert("pods", pod("a", "p", json!({})));
    server.insert(
        "leases",
        json!({"metadata": {"namespace": "a", "name": "l"}, "spec": {}}),
    );
    let client = server.client();
    let get = |path: &str| client.request::<Value>(http_get(path));

    let list = get("/api/v1/pods").await.unwrap();
    assert_eq!(list["kind"], "PodList");
    assert_eq!(list["apiVersion"], "v1");
    assert_eq!(
        list["metadata"]["resourceVersion"],
        server.resource_version().to_string()
    );
    let item = list["items"][0].as_object().unwrap();
    assert!(
        !item.contains_key("kind") && !item.contains_key("apiVersion"),
        "{item:?}"
    );
    let leases = get("/apis/coordination.k8s.io/v1/namespaces/a/leases")
        .await
        .unwrap();
    assert_eq!(leases["kind"], "LeaseList");
    assert_eq!(leases["apiVersion"], "coordination.k8s.io/v1");
    let one = get("/apis/coordination.k8s.io/v1/namespaces/a/leases/l")
        .await
        .unwrap();
    assert_eq!(
        (one["kind"].as_str(), one["apiVersion"].as_str()),
        (Some("Lease"), Some("coordination.k8s.io/v1"))
    );
    let uid = one["metadata"]["uid"].as_str().unwrap();
    assert_eq!(uid.len(), 36, "{uid}");

    let res = client
        .send(
            hyper::Request::get("/apis/coordination.k8s.io/v1/namespaces/a/leases/missing")
                .body(kube::client::Body::from(Vec::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.status(), 404);
    use http_body_util::BodyExt as _;
    let body: Value =
        serde_json::from_slice(&res.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(
        body,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "leases.coordination.k8s.io \"missing\" not found", "reason": "NotFound",
            "details": {"name": "missing", "group": "coordination.k8s.io", "kind": "leases"},
            "code": 404,
        })
    );

    let groups = get("/apis").await.unwrap();
    assert!(groups["groups"]
        .as_array()
        .unwrap()
        .iter()
        .any(|g| g["name"] == "resource.k8s.io"));
    let core = get("/api/v1").await.unwrap();
    assert!(core["resources"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["name"] == "pods" && r["namespaced"] == true));
}

/// What the self-managed certificates read and write: one Secret watched by name (a
/// field selector on `metadata.name`, as RBAC's resourceNames require of a watch), and the
/// cluster-scoped webhook configurations replaced at the resourceVersion read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_watched_by_name_and_webhook_configurations_replaced_at_a_version() {
    use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
    use k8s_openapi::api::core::v1::Secret;
    let server = ApiServer::start().await;
    let secrets: Api<Secret> = Api::namespaced(server.client(), "tollgate-system");
    let (reader, writer) = reflector::store::<Secret>();
    let stream = watcher(
        secrets.clone(),
        watcher::Config::default().fields("metadata.name=tollgate-tls"),
    )
    .default_backoff()
    .reflect(writer)
    .applied_objects();
    let task = tokio::spawn(async move {
        let mut s = std::pin::pin!(stream);
        while s.try_next().await.is_ok() {}
    });
    for name in ["other", "tollgate-tls"] {
        let s: Secret = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "tollgate-system"},
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "Y3J0", "tls.key": "a2V5"},
        }))
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
    }
    eventually("the one Secret in the store", || reader.state().len() == 1).await;
    assert_eq!(reader.state()[0].name_any(), "tollgate-tls");
    assert_eq!(
        reader.state()[0].data.as_ref().unwrap()["tls.key"].0,
        b"key"
    );
    let selected = server.requests_for(Verb::Watch, "secrets");
    assert!(selected
        .iter()
        .all(|r| r.param("fieldSelector").as_deref() == Some("metadata.name=tollgate-tls")));
    stop(task).await;

    let hooks: Api<MutatingWebhookConfiguration> = Api::all(server.client());
    server.insert(
        "mutatingwebhookconfigurations",
        json!({"metadata": {"name": "tollgate"}, "webhooks": [{"name": "mutate.tollgate.dev",
            "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "clientConfig": {"service": {"name": "tollgate", "namespace": "tollgate-system"}}}]}),
    );
    let mut read = hooks.get("tollgate").await.unwrap();
    let stale = read.clone();
    read.webhooks.as_mut().unwrap()[0].client_config.ca_bundle =
        Some(k8s_openapi::ByteString(b"CA".to_vec()));
    hooks
        .replace("tollgate", &PostParams::default(), &read)
        .await
        .unwrap();
    let e = api_error(
        hooks
            .replace("tollgate", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 409, "{e:?}");
    let stored = server
        .get("mutatingwebhookconfigurations", None, "tollgate")
        .unwrap();
    assert_eq!(stored["webhooks"][0]["clientConfig"]["caBundle"], "Q0E=");
}
