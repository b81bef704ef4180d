//! Connection serving: accepting TCP under `--max-connections`, the TLS handshake (bounded),
//! HTTP/1.1 or HTTP/2 by ALPN with their limits, the idle timeout, and closing every
//! connection gracefully when the server drains.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::extract::Request;
use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::sync::{watch, Semaphore};
use tokio_rustls::TlsAcceptor;
use tracing::{debug, warn};

use super::shutdown::stopped;
use super::Limits;

/// Every connection the server serves, counted by the slots they hold: draining waits for
/// every slot back.
pub(super) struct Connections {
    acceptor: TlsAcceptor,
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: Router,
    limits: Limits,
    slots: Arc<Semaphore>,
    max: usize,
    drain: watch::Sender<bool>,
}

impl Connections {
    pub(super) fn new(acceptor: TlsAcceptor, app: Router, limits: Limits) -> Connections {
        let max = limits.max_connections.clamp(1, u32::MAX as usize >> 3);
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(limits.header_timeout)
            .keep_alive(true);
        builder
            .http2()
            .timer(TokioTimer::new())
            .max_concurrent_streams(limits.max_streams)
            .keep_alive_interval(Duration::from_secs(30))
            .keep_alive_timeout(Duration::from_secs(10));
        Connections {
            acceptor,
            builder: Arc::new(builder),
            app,
            limits,
            slots: Arc::new(Semaphore::new(max)),
            max,
            drain: watch::channel(false).0,
        }
    }

    /// Accepts connections and serves each on its own task, until `until` resolves.
    pub(super) async fn accept_until(
        &self,
        listener: &TcpListener,
        until: impl Future<Output = ()>,
    ) {
        tokio::pin!(until);
        loop {
            let next = async {
                let permit = self.slots.clone().acquire_owned().await;
                (permit, listener.accept().await)
            };
            let (permit, accepted) = tokio::select! {
                x = next => x,
                _ = &mut until => return,
            };
            let Ok(permit) = permit else { return };
            let (tcp, peer) = match accepted {
                Ok(x) => x,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            // Without it, small HTTP/2 frames wait on delayed ACKs: tens of milliseconds of tail.
            let _ = tcp.set_nodelay(true);
            tokio::spawn(serve_connection(
                tcp,
                peer,
                self.acceptor.clone(),
                self.builder.clone(),
                self.app.clone(),
                self.limits.clone(),
                self.drain.subscribe(),
                permit,
            ));
        }
    }

    /// Asks every connection to close once its in-flight requests are answered (HTTP/2: a
    /// GOAWAY), and waits up to `timeout` for them all. False if some were still open.
    pub(super) async fn drain(self, timeout: Duration) -> bool {
        let _ = self.drain.send(true);
        let all_back = self.slots.acquire_many(self.max as u32);
        tokio::time::timeout(timeout, all_back).await.is_ok()
    }
}

/// What a connection is doing, for the idle timeout.
struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    fn touch(&self) {
        if let Ok(mut t) = self.last.lock() {
            *t = Instant::now();
        }
    }

    /// How long the connection has had no request in flight (zero while one is).
    fn idle_for(&self) -> Duration {
        if self.in_flight.load(Ordering::Acquire) > 0 {
            return Duration::ZERO;
        }
        self.last.lock().map(|t| t.elapsed()).unwrap_or_default()
    }
}

/// A request in flight on a connection; the connection is active until it is dropped.
struct Busy(Arc<Activity>);

impl Busy {
    fn new(a: Arc<Activity>) -> Busy {
        a.in_flight.fetch_add(1, Ordering::AcqRel);
        a.touch();
        Busy(a)
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.touch();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// One accepted connection: the TLS handshake (bounded), then HTTP/1.1 or HTTP/2 until the
/// client leaves, the connection idles past the idle timeout, or the server drains. The
/// permit is the connection's slot under `--max-connections`, held until it is closed.
#[allow(clippy::too_many_arguments)]
async fn serve_connection(
    tcp: tokio::net::TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    builder: Arc<auto::Builder<TokioExecutor>>,
    app: Router,
    limits: Limits,
    mut drain: watch::Receiver<bool>,
    permit: tokio::sync::OwnedSemaphorePermit,
) {
    let _permit = permit;
    let tls = match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(tcp)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            debug!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            debug!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let activity = Arc::new(Activity {
        in_flight: AtomicUsize::new(0),
        last: Mutex::new(Instant::now()),
    });
    let tracked = activity.clone();
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let busy = Busy::new(tracked.clone());
        let call = tower::ServiceExt::oneshot(app.clone(), req);
        async move {
            let resp = call.await;
            drop(busy);
            resp
        }
    });
    let conn = builder.serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let check = (limits.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(check);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut closing = false;
    loop {
        tokio::select! {
            r = conn.as_mut() => {
                if let Err(e) = r {
                    debug!(%peer, error = %e, "connection ended with an error");
                }
                return;
            }
            _ = stopped(&mut drain), if !closing => {
                conn.as_mut().graceful_shutdown();
                closing = true;
            }
            _ = tick.tick(), if !closing => {
                if activity.idle_for() >= limits.idle_timeout {
                    debug!(%peer, "closing an idle connection");
                    conn.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}
