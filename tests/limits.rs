//! Every limit of the server, against a misbehaving client on loopback: the handshake
//! timeout, the HTTP/1.1 header timeout, the review deadline, the body cap (with and without
//! Content-Length), the connection limit, the HTTP/2 stream limit and the idle timeout.
//!
//! Timeouts here are short so that the tests are quick; the bounds on waiting are generous
//! safety nets, never performance assertions.

use crate::common;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Bytes;
use common::net::{self, Client, TestServer};
use http_body_util::{BodyExt as _, Either, Full};
use hyper::body::{Body, Frame};
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// Longest any single wait in these tests may take before the test fails.
const BOUND: Duration = Duration::from_secs(10);

/// Reads until the peer closes the connection (or resets it), returning what it sent.
async fn read_to_close<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut out = vec![];
    let mut buf = [0u8; 4096];
    loop {
        match tokio::time::timeout(BOUND, s.read(&mut buf)).await {
            Err(_) => panic!("the server kept the connection open past {BOUND:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => return out,
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
}

/// Reads one HTTP/1.1 response head and returns its status code.
async fn read_status<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> u16 {
    let mut out = vec![];
    let mut buf = [0u8; 4096];
    while !out.windows(4).any(|w| w == b"\r\n\r\n") {
        match tokio::time::timeout(BOUND, s.read(&mut buf)).await {
            Err(_) => panic!("no response within {BOUND:?}"),
            Ok(Ok(0)) | Ok(Err(_)) => panic!("closed before a response: {out:?}"),
            Ok(Ok(n)) => out.extend_from_slice(&buf[..n]),
        }
    }
    let head = String::from_utf8_lossy(&out);
    head.split(' ').nth(1).unwrap().parse().unwrap()
}

async fn h1_tls(server: &TestServer) -> tokio_rustls::client::TlsStream<TcpStream> {
    let cfg = net::client_config(&server.ca_pem, &[b"http/1.1"], None);
    net::tls_connect(server.addr(), cfg).await.unwrap()
}

#[tokio::test]
async fn a_client_that_never_handshakes_is_closed() {
    let server = net::start(|o| o.limits.handshake_timeout = Duration::from_millis(300)).await;
    // Nothing at all after the TCP handshake.
    let mut silent = TcpStream::connect(server.addr()).await.unwrap();
    // Half a handshake: the start of a TLS record that never completes.
    let mut half = TcpStream::connect(server.addr()).await.unwrap();
    half.write_all(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00])
        .await
        .unwrap();
    assert!(read_to_close(&mut silent).await.is_empty());
    assert!(read_to_close(&mut half).await.is_empty());
    // The slots are free again: a real client is served.
    let mut c = Client::connect(server.addr(), &server.ca_pem, false).await;
    assert_eq!(c.request("GET", "/healthz", vec![]).await.unwrap().0, 200);
    server.running.shutdown().await;
}

#[tokio::test]
async fn slow_request_headers_are_cut_off() {
    let server = net::start(|o| o.limits.header_timeout = Duration::from_millis(300)).await;
    let mut tls = h1_tls(&server).await;
    tls.write_all(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\n")
        .await
        .unwrap();
    // One header byte every 50 ms: always sending, never finishing.
    let mut closed = false;
    for _ in 0..200 {
        if tls.write_all(b"x").await.is_err() {
            closed = true;
            break;
        }
        let mut buf = [0u8; 256];
        match tokio::time::timeout(Duration::from_millis(50), tls.read(&mut buf)).await {
            Err(_) => continue,
            Ok(Ok(0)) | Ok(Err(_)) => {
                closed = true;
                break;
            }
            // hyper may answer 408 before closing.
            Ok(Ok(_)) => {
                assert!(String::from_utf8_lossy(&buf).starts_with("HTTP/1.1 408"));
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "a client dripping its headers kept the connection");
    server.running.shutdown().await;
}

#[tokio::test]
async fn a_body_slower_than_the_review_deadline_gets_408() {
    let server = net::start(|o| o.limits.review_deadline = Duration::from_millis(300)).await;
    let mut tls = h1_tls(&server).await;
    tls.write_all(
        b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"apiVersion\"",
    )
    .await
    .unwrap();
    assert_eq!(read_status(&mut tls).await, 408);
    server.running.shutdown().await;
}

#[tokio::test]
async fn a_body_over_the_cap_gets_413_with_or_without_content_length() {
    let server = net::start(|o| o.limits.max_body_bytes = 1024).await;
    let big = vec![b' '; 4096];

    // Declared: refused before the body is read.
    let mut tls = h1_tls(&server).await;
    tls.write_all(
        format!(
            "POST /validate HTTP/1.1\r\nHost: localhost\r\nContent-Length: {}\r\n\r\n",
            big.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(read_status(&mut tls).await, 413);

    // Chunked, no length: refused once the cap is crossed.
    let mut tls = h1_tls(&server).await;
    let mut req =
        b"POST /validate HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n"
            .to_vec();
    for chunk in big.chunks(512) {
        req.extend_from_slice(format!("{:x}\r\n", chunk.len()).as_bytes());
        req.extend_from_slice(chunk);
        req.extend_from_slice(b"\r\n");
    }
    req.extend_from_slice(b"0\r\n\r\n");
    tls.write_all(&req).await.unwrap();
    assert_eq!(read_status(&mut tls).await, 413);

    // HTTP/2 too, where the body is a stream of DATA frames.
    let mut c = Client::connect(server.addr(), &server.ca_pem, true).await;
    let (status, _) = c.post("/validate", big.clone()).await;
    assert_eq!(status, 413);
    // Under the cap is fine on the same connection.
    let (status, _) = c
        .post("/validate", b"{\"kind\":\"AdmissionReview\"}".to_vec())
        .await;
    assert_eq!(status, 400, "a small body is read and judged");
    server.running.shutdown().await;
}

#[tokio::test]
async fn connections_over_the_limit_wait_and_are_served_later() {
    let server = net::start(|o| o.limits.max_connections = 2).await;
    let mut a = Client::connect(server.addr(), &server.ca_pem, false).await;
    let mut b = Client::connect(server.addr(), &server.ca_pem, true).await;
    assert_eq!(a.request("GET", "/healthz", vec![]).await.unwrap().0, 200);
    assert_eq!(b.request("GET", "/healthz", vec![]).await.unwrap().0, 200);

    let (addr, ca) = (server.addr(), server.ca_pem.clone());
    let third = tokio::spawn(async move {
        let mut c = Client::connect(addr, &ca, false).await;
        c.post(
            "/mutate",
            common::fixture("resnet50-worker-generatename.mutate.json"),
        )
        .await
    });
    // Its TCP connection sits in the accept queue: no TLS handshake, no answer yet.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !third.is_finished(),
        "a third connection was served at once"
    );
    // The two served ones still work meanwhile.
    assert_eq!(a.request("GET", "/healthz", vec![]).await.unwrap().0, 200);

    drop(a);
    let (status, body) = tokio::time::timeout(BOUND, third)
        .await
        .expect("the waiting connection was served once a slot freed")
        .unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(b.request("GET", "/healthz", vec![]).await.unwrap().0, 200);
    server.running.shutdown().await;
}

/// A request body that never sends anything: holds its stream open.
struct Stalled;

impl Body for Stalled {
    type Data = Bytes;
    type Error = Infallible;
    fn poll_frame(
        self: Pin<&mut Self>,
        _: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Pending
    }
}

#[tokio::test]
async fn http2_streams_over_the_limit_wait_instead_of_failing() {
    let server = net::start(|o| {
        o.limits.max_streams = 2;
        o.limits.review_deadline = Duration::from_millis(1500);
    })
    .await;
    let cfg = net::client_config(&server.ca_pem, &[b"h2"], None);
    let tls = net::tls_connect(server.addr(), cfg).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::handshake::<_, _, Either<Full<Bytes>, Stalled>>(
        TokioExecutor::new(),
        TokioIo::new(tls),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let request = |body| {
        hyper::Request::post("https://localhost/validate")
            .body(body)
            .unwrap()
    };
    // Give the client the server's SETTINGS (max concurrent streams) before the burst.
    {
        let mut s = send.clone();
        s.ready().await.unwrap();
        let r = s
            .send_request(request(Either::Left(Full::new(Bytes::from_static(b"{}")))))
            .await
            .unwrap();
        assert_eq!(r.status(), 400);
    }
    // Two streams whose bodies never come fill the limit.
    let mut stalled = vec![];
    for _ in 0..2 {
        let mut s = send.clone();
        stalled.push(tokio::spawn(async move {
            s.ready().await.unwrap();
            let r = s
                .send_request(request(Either::Right(Stalled)))
                .await
                .unwrap();
            r.status().as_u16()
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // More streams: the client queues them rather than erroring.
    let mut queued = vec![];
    for _ in 0..4 {
        let mut s = send.clone();
        let body = common::fixture("resnet50-worker-generatename.validate.json");
        queued.push(tokio::spawn(async move {
            s.ready().await.unwrap();
            let r = s
                .send_request(request(Either::Left(Full::new(Bytes::from(body)))))
                .await
                .unwrap();
            let status = r.status().as_u16();
            r.into_body().collect().await.unwrap();
            status
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        queued.iter().all(|t| !t.is_finished()),
        "streams beyond max_streams were served while two were open"
    );
    // The stalled ones hit the review deadline (408), and the queued ones then go through.
    for t in stalled {
        let status = tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
        assert_eq!(status, 408);
    }
    for t in queued {
        let status = tokio::time::timeout(BOUND, t).await.unwrap().unwrap();
        assert_eq!(status, 200);
    }
    server.running.shutdown().await;
}

#[tokio::test]
async fn idle_connections_are_closed_and_give_their_slot_back() {
    let server = net::start(|o| {
        o.limits.max_connections = 1;
        o.limits.idle_timeout = Duration::from_millis(300);
    })
    .await;
    // An HTTP/2 client that answers pings but sends no requests would otherwise hold the
    // only slot for ever.
    let mut idle = Client::connect(server.addr(), &server.ca_pem, true).await;
    assert_eq!(
        idle.request("GET", "/healthz", vec![]).await.unwrap().0,
        200
    );
    // So would one that completes TLS and then says nothing at all.
    let (addr, ca) = (server.addr(), server.ca_pem.clone());
    let next = tokio::spawn(async move {
        let mut c = Client::connect(addr, &ca, false).await;
        c.request("GET", "/healthz", vec![]).await.unwrap().0
    });
    let status = tokio::time::timeout(BOUND, next)
        .await
        .expect("the idle connection was closed and the next one served")
        .unwrap();
    assert_eq!(status, 200);
    // The idle client was told to go away: its next request fails cleanly.
    assert!(idle.request("GET", "/healthz", vec![]).await.is_err());

    let mut silent = h1_tls(&server).await;
    assert!(read_to_close(&mut silent).await.is_empty());
    server.running.shutdown().await;
}

#[tokio::test]
async fn a_client_that_never_reads_its_responses_loses_its_slot() {
    let server = net::start(|o| {
        o.limits.max_connections = 1;
        o.limits.idle_timeout = Duration::from_millis(300);
    })
    .await;
    // Pipelined requests, never a response read: the server's writes block once the small
    // receive buffer and its send buffer are full, with no request in flight.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let tcp = socket.connect(server.addr()).await.unwrap();
    let cfg = net::client_config(&server.ca_pem, &[b"http/1.1"], None);
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg))
        .connect(
            rustls::pki_types::ServerName::try_from("localhost").unwrap(),
            tcp,
        )
        .await
        .unwrap();
    let (reader, mut writer) = tokio::io::split(tls);
    let flood = tokio::spawn(async move {
        let req = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n".repeat(100);
        for _ in 0..50 {
            match tokio::time::timeout(BOUND, writer.write_all(&req)).await {
                Ok(Ok(())) => {}
                _ => break,
            }
        }
        writer
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // Someone else gets the slot once the stuck connection is dropped.
    let (addr, ca) = (server.addr(), server.ca_pem.clone());
    let next = tokio::spawn(async move {
        let mut c = Client::connect(addr, &ca, true).await;
        c.request("GET", "/healthz", vec![]).await.unwrap().0
    });
    let status = tokio::time::timeout(BOUND, next)
        .await
        .expect("a connection that reads nothing kept the only slot")
        .unwrap();
    assert_eq!(status, 200);
    drop((reader, flood));
    server.running.shutdown().await;
}
