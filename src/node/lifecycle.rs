//! [`Node::serve`]: the front ends up, membership supervised, and the
//! shutdown in the order the safety rules need (NOT_SERVING, drain, final
//! mark, release).

use std::future::Future;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::{instance_id, Node, ServeError, ShutdownReport};
use crate::config::Config;
use crate::modes::Issuer;
use crate::proto;
use crate::server::{admin, grpc, health, http, listener, request_size, tls};
use tokio_rustls::TlsAcceptor;

type Served = JoinHandle<()>;

/// The running front ends.
struct FrontEnds {
    grpc: Served,
    http: Served,
    upkeep: JoinHandle<()>,
    /// Reloads the TLS certificate when its files change or on SIGHUP.
    reload: Option<JoinHandle<()>>,
    stop: watch::Sender<bool>,
    /// Measures the issue rate and publishes this node's status.
    status: super::status::StatusTask,
}

async fn wait_stop(mut rx: watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}

impl Node {
    /// Serves gRPC on `grpc` and HTTP on `http` until `shutdown` completes,
    /// then shuts down in order and returns what it stored.
    pub async fn serve(
        self,
        grpc: TcpListener,
        http: TcpListener,
        shutdown: impl Future<Output = ()> + Send,
    ) -> Result<ShutdownReport, ServeError> {
        let (reporter, health_service) = tonic_health::server::health_reporter();
        let state = health::ServingState::new(reporter);
        let monitor_stop = Arc::new(Notify::new());
        let monitor = tokio::spawn(health::run(
            Arc::clone(&self.issuer),
            Arc::clone(&self.clock),
            state.clone(),
            Arc::clone(&monitor_stop),
            self.config.store.max_unhealthy,
        ));
        let addrs = (grpc.local_addr().ok(), http.local_addr().ok());
        // Before the front ends: a SIGHUP once calls are answered reloads.
        let mut format_watch = self.watch_formats();
        // Hide key rotations made through other nodes (Consul).
        if self.membership.consul().is_some() {
            format_watch.push(tokio::spawn(self.hide_keys.clone().watch()));
        }
        let mut fronts = self.start_front_ends(grpc, http, health_service, &state)?;
        let Node {
            config,
            issuer,
            membership,
            bound,
            renewal,
            state_watch,
            rate_sampling,
            ..
        } = self;
        let worker = membership.key();
        let running = membership.run(Arc::clone(issuer.gate()), bound).await;
        tracing::info!(
            grpc = addrs.0.map(tracing::field::display),
            http = addrs.1.map(tracing::field::display),
            datacenter = worker.datacenter,
            worker = worker.worker,
            layout = %config.layout,
            "idgen serving"
        );
        // Run until the shutdown signal, or until a front end dies.
        let early = tokio::select! {
            _ = shutdown => None,
            r = &mut fronts.grpc => Some(format!("gRPC server stopped: {r:?}")),
            r = &mut fronts.http => Some(format!("HTTP server stopped: {r:?}")),
        };
        tracing::info!("shutting down: NOT_SERVING, draining in-flight calls");
        // Stop the monitor first so it cannot report SERVING after drain.
        monitor_stop.notify_one();
        let _ = monitor.await;
        state.drain().await;
        let (drained, status) = fronts.drain(&config).await;
        // Closing the generator and storing the final mark happen together;
        // in a cluster the lock is released and the service deregistered
        // after that.
        for task in format_watch {
            task.abort();
        }
        let final_hwm_ms = running.finish().await;
        // The record every console shows: "stopped", even when the final
        // mark failed (the node stops either way).
        status.finish().await;
        let final_hwm_ms = final_hwm_ms?;
        drop(rate_sampling);
        drop(state_watch);
        // Last: nothing renews once the mark is final and the lock gone.
        drop(renewal);
        tracing::info!(final_hwm_ms, drained, "idgen stopped");
        match early {
            Some(reason) => Err(ServeError::Transport(reason)),
            None => Ok(ShutdownReport {
                final_hwm_ms,
                drained,
            }),
        }
    }

    fn start_front_ends(
        &self,
        grpc: TcpListener,
        http: TcpListener,
        health_service: tonic_health::pb::health_server::HealthServer<
            impl tonic_health::pb::health_server::Health,
        >,
        state: &health::ServingState,
    ) -> Result<FrontEnds, ServeError> {
        let config = &self.config;
        // Reflection v1, and v1alpha for older tools (grpcurl before 1.8.8,
        // Python's grpcio-reflection, older Postman and Evans).
        let reflection_builder = || {
            tonic_reflection::server::Builder::configure()
                .register_encoded_file_descriptor_set(proto::FILE_DESCRIPTOR_SET)
                .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        };
        let reflection = reflection_builder()
            .build_v1()
            .map_err(|e| ServeError::Transport(format!("reflection: {e}")))?;
        let reflection_v1alpha = reflection_builder()
            .build_v1alpha()
            .map_err(|e| ServeError::Transport(format!("reflection v1alpha: {e}")))?;
        let max_request = config.server.max_request_size;
        let admin_service = Arc::new(admin::AdminService::new(self.admin_deps()));
        let idgen = proto::id_gen_server::IdGenServer::new(
            grpc::IdGenService::new(Arc::clone(&self.issuer))
                .with_admin(Arc::clone(&admin_service)),
        )
        .max_decoding_message_size(max_request);
        let admin = proto::admin_server::AdminServer::from_arc(Arc::clone(&admin_service))
            .max_decoding_message_size(max_request);
        let (stop, stop_rx) = watch::channel(false);
        let (grpc_tls, http_tls, reload) = acceptors(config)?;
        let grpc_routes = tonic::service::Routes::new(health_service)
            .add_service(reflection)
            .add_service(reflection_v1alpha)
            .add_service(idgen)
            .add_service(admin)
            .prepare();
        let grpc = tokio::spawn(listener::serve(
            grpc,
            listener::Port::Grpc,
            config.server.connections,
            grpc_tls,
            config.server.allow.clone(),
            tower::Layer::layer(
                &request_size::RequestSizeLayer::new(max_request),
                grpc_routes,
            ),
            wait_stop(stop_rx.clone()),
        ));
        let http_state = http::HttpState {
            issuer: Arc::clone(&self.issuer),
            metrics: self.metrics.clone(),
            ready: Arc::clone(&state.ready),
            live: Arc::clone(&state.live),
            rpc: Arc::new(http::HttpMetrics::default()),
            admin: admin_service,
            cluster: self.cluster_status(),
            cors: Arc::new(config.server.cors.clone()),
        };
        let status = super::status::StatusTask::start(http_state.clone());
        let http = tokio::spawn(listener::serve(
            http,
            listener::Port::Http,
            config.server.connections,
            http_tls,
            config.server.allow.clone(),
            http::router(http_state),
            wait_stop(stop_rx),
        ));
        let metrics = self.metrics.clone();
        let upkeep = tokio::spawn(async move {
            let mut t = tokio::time::interval(std::time::Duration::from_secs(5));
            loop {
                t.tick().await;
                metrics.run_upkeep();
            }
        });
        Ok(FrontEnds {
            grpc,
            http,
            upkeep,
            reload,
            stop,
            status,
        })
    }

    /// Where the console finds every node's status: the Consul folder of
    /// status records, or this node alone on the embedded store.
    fn cluster_status(&self) -> crate::server::console::ClusterStatus {
        let board = match (self.membership.consul(), &self.config.store.backend) {
            (Some(client), crate::config::Backend::Consul(cc)) => {
                let advertise = self
                    .config
                    .node
                    .advertise
                    .unwrap_or(self.config.server.grpc_listen);
                Some(crate::cluster::status::StatusBoard::new(
                    client.clone(),
                    cc.keys.clone(),
                    cc.service.clone(),
                    instance_id(&self.config, advertise),
                ))
            }
            _ => None,
        };
        crate::server::console::ClusterStatus::new(board)
    }

    /// The format reload triggers besides the admin API: SIGHUP, and in
    /// Consul the definitions other nodes change.
    fn watch_formats(&self) -> Vec<JoinHandle<()>> {
        let Some(catalog) = self.formats.clone() else {
            return Vec::new();
        };
        let mut tasks = vec![tokio::spawn(Arc::clone(&catalog).watch_sighup())];
        if let (Some(client), crate::config::Backend::Consul(cc)) =
            (self.membership.consul(), &self.config.store.backend)
        {
            tasks.push(tokio::spawn(
                catalog.watch_consul(client.clone(), cc.keys.clone()),
            ));
        }
        tasks
    }

    fn admin_deps(&self) -> admin::AdminDeps {
        let config = &self.config;
        let issuer: &Arc<Issuer> = &self.issuer;
        let cluster = match (self.membership.consul(), &config.store.backend) {
            (Some(client), crate::config::Backend::Consul(cc)) => {
                Some((client.clone(), cc.keys.clone()))
            }
            _ => None,
        };
        let advertise = config.node.advertise.unwrap_or(config.server.grpc_listen);
        admin::AdminDeps {
            admin_token: config.admin.token.clone(),
            client_cert_names: config.admin.client_cert_names.clone(),
            allow: config.admin.allow.clone(),
            segments: self.admin_segments.clone(),
            strict: issuer.strict().cloned(),
            segment_server: issuer.segment_server().cloned(),
            cluster,
            node: admin::NodeFacts {
                instance: instance_id(config, advertise),
                address: advertise.to_string(),
                worker: self.membership.key(),
                lease: issuer.leases().cloned(),
                lease_zone: config.lease.as_ref().map(|l| l.zone),
                formats: issuer.formats().cloned(),
                layout_hide: config
                    .layout_hide
                    .as_ref()
                    .map(|h| (h.key_id.clone(), h.version_bits)),
            },
            clock: Arc::clone(&self.clock),
            snapshots: self.snapshots.clone(),
            formats: self.formats.clone(),
            hwm_reserve: config.hwm.reserve,
            datacenters: match (self.membership.consul(), &config.store.backend) {
                (Some(client), crate::config::Backend::Consul(cc)) => {
                    Some(crate::cluster::datacenter_release::Federation {
                        client: client.clone(),
                        keys: cc.keys.clone(),
                        service: cc.service.clone(),
                        primary: cc.primary_datacenter.clone(),
                    })
                }
                _ => None,
            },
            hide_keys: self.hide_keys.clone(),
        }
    }
}

type Acceptors = (
    Option<TlsAcceptor>,
    Option<TlsAcceptor>,
    Option<JoinHandle<()>>,
);

/// The TLS acceptors of both ports, and the reload task (`None`: plaintext, with a warning when
/// that plaintext is on the network).
fn acceptors(config: &Config) -> Result<Acceptors, ServeError> {
    let Some(settings) = &config.server.tls else {
        if config.server.insecure {
            tracing::warn!(
                grpc = %config.server.grpc_listen,
                http = %config.server.http_listen,
                "serving plaintext on a non-loopback address (server.insecure = true): the admin token and IDs cross the network in clear text; set [server.tls] to encrypt"
            );
        }
        return Ok((None, None, None));
    };
    let fail = |e: tls::TlsError| ServeError::Transport(e.to_string());
    let identity = tls::Identity::load(settings).map_err(fail)?;
    tracing::info!(cert = %settings.cert.display(), "serving TLS on both ports");
    let grpc = identity.acceptor(listener::Port::Grpc).map_err(fail)?;
    let http = identity.acceptor(listener::Port::Http).map_err(fail)?;
    for result in ["ok", "error"] {
        metrics::counter!(crate::metrics::TLS_RELOADS, "result" => result).increment(0);
    }
    let reload = tokio::spawn(tls::watch(identity, settings.clone()));
    Ok((Some(grpc), Some(http), Some(reload)))
}

impl FrontEnds {
    /// Stops accepting and waits for in-flight calls, at most
    /// `server.shutdown_grace`; returns whether every call finished, and
    /// the status task (stopped last, with its "stopped" record).
    async fn drain(mut self, config: &Config) -> (bool, super::status::StatusTask) {
        let _ = self.stop.send(true);
        let grace = config.server.shutdown_grace;
        let drained = tokio::time::timeout(grace, async {
            if !self.grpc.is_finished() {
                let _ = (&mut self.grpc).await;
            }
            if !self.http.is_finished() {
                let _ = (&mut self.http).await;
            }
        })
        .await
        .is_ok();
        if !drained {
            tracing::warn!(grace = %humantime::format_duration(grace), "connections still open after the grace period (calls in flight, or clients that did not answer the shutdown notice); closing anyway");
            self.grpc.abort();
            self.http.abort();
        }
        self.upkeep.abort();
        if let Some(reload) = self.reload {
            reload.abort();
        }
        (drained, self.status)
    }
}
