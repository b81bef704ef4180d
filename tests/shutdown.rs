//! Graceful shutdown of the real binary on SIGTERM and SIGINT: readiness goes false while
//! it keeps serving, then it stops accepting, finishes the reviews in flight (HTTP/1.1 and
//! HTTP/2), and exits 0 within shutdown delay + drain timeout.
#![cfg(unix)]

use crate::common;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use common::net::{self, Client};
use common::{process, scrape, slow};
use hyper::body::Frame;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::Value;
use tokio::sync::mpsc;

/// A request body sent in pieces as the test decides.
struct ChannelBody(mpsc::Receiver<Bytes>);

impl hyper::body::Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.0.poll_recv(cx).map(|b| b.map(|b| Ok(Frame::data(b))))
    }
}

async fn in_flight(served: &process::Served) -> f64 {
    let text = net::get_metrics(served.metrics_addr.unwrap()).await;
    scrape::value(&scrape::parse(&text), "tollgate_requests_in_flight", &[]).unwrap()
}

async fn readyz(served: &process::Served) -> std::io::Result<u16> {
    let cfg = net::client_config(&served.ca_pem, &[b"http/1.1"], None);
    let mut c = Client::connect_with(served.addr, cfg).await?;
    c.request("GET", "/readyz", vec![])
        .await
        .map(|(s, _)| s)
        .map_err(std::io::Error::other)
}

fn refused(addr: std::net::SocketAddr) -> bool {
    matches!(
        std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)),
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
    )
}

fn check_review(body: &[u8], sent: &[u8]) {
    let got: Value = serde_json::from_slice(body).unwrap();
    let sent: Value = serde_json::from_slice(sent).unwrap();
    assert_eq!(got["response"]["uid"], sent["request"]["uid"]);
    assert_eq!(got["response"]["allowed"], true);
    assert_eq!(got["response"]["patchType"], "JSONPatch", "{got}");
}

const DELAY_MS: u64 = 2000;
const DRAIN_MS: u64 = 5000;

#[tokio::test]
async fn sigterm_finishes_reviews_in_flight_over_http1_and_http2_then_exits() {
    let (dir, ca) = process::workdir();
    let delay = DELAY_MS.to_string();
    let drain = DRAIN_MS.to_string();
    let mut served = process::serve(
        dir,
        ca,
        None,
        "json",
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--shutdown-delay-ms",
            &delay,
            "--drain-timeout-ms",
            &drain,
            // Longer than the test holds a body half-sent.
            "--review-deadline-ms",
            "30000",
        ],
    );
    let review = common::fixture("resnet50-master-0.mutate.json");
    let half = review.len() / 2;

    // HTTP/1.1: headers and half the body.
    let mut h1 = slow::start(served.addr, &served.ca_pem, "/mutate", &review).await;

    // HTTP/2: a stream with half its body.
    let tls = net::tls_connect(
        served.addr,
        net::client_config(&served.ca_pem, &[b"h2"], None),
    )
    .await
    .unwrap();
    let (mut h2, conn) = hyper::client::conn::http2::handshake::<_, _, ChannelBody>(
        TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .unwrap();
    let h2_conn = tokio::spawn(conn);
    let (tx, rx) = mpsc::channel(4);
    let req = hyper::Request::post("https://localhost/mutate")
        .header("content-type", "application/json")
        .body(ChannelBody(rx))
        .unwrap();
    let h2_response = tokio::spawn(h2.send_request(req));
    tx.send(Bytes::copy_from_slice(&review[..half]))
        .await
        .unwrap();

    // Both reviews are in the server's hands before the signal.
    let start = Instant::now();
    while in_flight(&served).await < 2.0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "reviews never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    let signalled = Instant::now();
    served.signal("TERM");

    // During the shutdown delay: not ready, yet still accepting and answering.
    let mut saw_503 = false;
    while signalled.elapsed() < Duration::from_millis(DELAY_MS) {
        match readyz(&served).await {
            Ok(503) => {
                saw_503 = true;
                break;
            }
            Ok(200) => tokio::time::sleep(Duration::from_millis(20)).await,
            other => panic!("/readyz during the shutdown delay: {other:?}"),
        }
    }
    assert!(saw_503, "readiness turned false during the delay");
    served
        .wait_for_line(|l| l.contains("shutdown requested"))
        .await;

    // After the delay: the listener is closed.
    served
        .wait_for_line(|l| l.contains("no longer accepting"))
        .await;
    assert!(
        refused(served.addr),
        "new connections are refused while draining"
    );

    // The reviews in flight complete, correctly.
    let (status, close, body) = h1.finish().await;
    assert_eq!(status, 200);
    check_review(&body, &review);
    assert!(
        close || h1.closed_by_server().await,
        "the HTTP/1.1 connection is closed after its last response"
    );
    tx.send(Bytes::copy_from_slice(&review[half..]))
        .await
        .unwrap();
    drop(tx);
    let resp = tokio::time::timeout(Duration::from_secs(20), h2_response)
        .await
        .expect("HTTP/2 response within the safety bound")
        .unwrap()
        .expect("the HTTP/2 stream in flight completes");
    assert_eq!(resp.status(), 200);
    let body = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    check_review(&body, &review);
    // GOAWAY: the connection ends and takes no new stream.
    tokio::time::timeout(Duration::from_secs(20), h2_conn)
        .await
        .expect("the HTTP/2 connection closes after GOAWAY")
        .unwrap()
        .unwrap();
    let (_tx, rx) = mpsc::channel(1);
    let again = hyper::Request::post("https://localhost/mutate")
        .body(ChannelBody(rx))
        .unwrap();
    assert!(h2.send_request(again).await.is_err());

    let bound = Duration::from_millis(DELAY_MS + DRAIN_MS) + Duration::from_secs(10);
    let status = served
        .wait_exit(bound)
        .await
        .expect("exits within shutdown delay + drain timeout");
    let took = signalled.elapsed();
    assert!(status.success(), "{status}");
    assert!(refused(served.addr));
    let lines = served.lines();
    for msg in ["SIGTERM received", "tollgate stopped"] {
        assert!(lines.iter().any(|l| l.contains(msg)), "{msg}: {lines:#?}");
    }
    assert!(!lines.iter().any(|l| l.contains("drain timeout reached")));
    // Straight to stderr, past the harness's capture: the measured shutdown time.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stderr(),
        "tests/shutdown.rs: SIGTERM to exit took {took:?} (delay {DELAY_MS} ms, drain bound {DRAIN_MS} ms)"
    );
}

#[tokio::test]
async fn sigint_exits_after_the_drain_timeout_even_if_a_client_never_finishes() {
    let (dir, ca) = process::workdir();
    let mut served = process::serve(
        dir,
        ca,
        None,
        "json",
        &[
            "--metrics-listen",
            "127.0.0.1:0",
            "--shutdown-delay-ms",
            "200",
            "--drain-timeout-ms",
            "1000",
            "--review-deadline-ms",
            "120000",
        ],
    );
    let review = common::fixture("resnet50-master-0.mutate.json");
    let _stuck = slow::start(served.addr, &served.ca_pem, "/mutate", &review).await;
    let start = Instant::now();
    while in_flight(&served).await < 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "review never arrived"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    served.signal("INT");
    // Far below the 120 s the stuck review would otherwise hold the process.
    let status = served
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("the drain timeout bounds the exit");
    assert!(status.success(), "{status}");
    let lines = served.lines();
    for msg in [
        "SIGINT received",
        "drain timeout reached",
        "tollgate stopped",
    ] {
        assert!(lines.iter().any(|l| l.contains(msg)), "{msg}: {lines:#?}");
    }
}

#[tokio::test]
async fn sigterm_with_nothing_in_flight_exits_after_the_delay() {
    let (dir, ca) = process::workdir();
    let mut served = process::serve(dir, ca, None, "text", &["--shutdown-delay-ms", "100"]);
    assert_eq!(readyz(&served).await.unwrap(), 200);
    served.signal("TERM");
    let status = served
        .wait_exit(Duration::from_secs(30))
        .await
        .expect("exits");
    assert!(status.success(), "{status}");
    assert!(refused(served.addr));
}
