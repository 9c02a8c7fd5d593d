//! Every control-plane gRPC call timed and counted by method and status code: a
//! `tower` layer in front of the agent's tonic services.
//!
//! The status is read from the response headers: tonic answers an error as a
//! trailers-only response, so a failed unary call has its `grpc-status` there; a call
//! whose headers carry none succeeded so far, and counts as `ok`. A server stream that
//! fails after its first message (a long Readdir) is therefore counted `ok`; its time
//! is the time to its first response.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tonic::codegen::http;

use super::Metrics;

/// The layer: wrap the agent's routes with it (`Server::builder().layer(...)`).
#[derive(Clone, Debug)]
pub struct GrpcMetricsLayer {
    metrics: Arc<Metrics>,
}

impl GrpcMetricsLayer {
    pub fn new(metrics: Arc<Metrics>) -> GrpcMetricsLayer {
        GrpcMetricsLayer { metrics }
    }
}

impl<S> tower::Layer<S> for GrpcMetricsLayer {
    type Service = GrpcMetricsService<S>;
    fn layer(&self, inner: S) -> GrpcMetricsService<S> {
        GrpcMetricsService { inner, metrics: self.metrics.clone() }
    }
}

/// The routes behind [`GrpcMetricsLayer`].
#[derive(Clone, Debug)]
pub struct GrpcMetricsService<S> {
    inner: S,
    metrics: Arc<Metrics>,
}

/// The status code a response's headers carry (`ok` when they carry none).
pub fn response_code(headers: &http::HeaderMap) -> tonic::Code {
    headers
        .get("grpc-status")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<i32>().ok())
        .map_or(tonic::Code::Ok, tonic::Code::from_i32)
}

impl<S, B, R> tower::Service<http::Request<B>> for GrpcMetricsService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let method = request.uri().path().trim_start_matches('/').to_owned();
        let started = Instant::now();
        let call = self.inner.call(request);
        let metrics = self.metrics.clone();
        Box::pin(async move {
            let response = call.await;
            let code = match &response {
                Ok(r) => response_code(r.headers()),
                Err(_) => tonic::Code::Unknown,
            };
            metrics.grpc_call(&method, code, started.elapsed());
            response
        })
    }
}
