//! OTLP/gRPC for the profiles uploader: `ProfilesService/Export` with tonic, driven on a
//! current-thread Tokio runtime owned by the uploader thread (the host application's
//! runtime is never used, nor required).

use std::time::Duration;

use opentelemetry_proto::tonic::collector::profiles::v1development::profiles_service_client::ProfilesServiceClient;
use opentelemetry_proto::tonic::collector::profiles::v1development::ExportProfilesServiceRequest;
use prost::Message;
use reqwest::header::HeaderMap;
use reqwest::Url;
use tonic::codec::CompressionEncoding;
use tonic::metadata::{AsciiMetadataValue, MetadataKey};
use tonic::transport::Channel;

use crate::config::ClientTls;

/// A lazily connected profiles client and the runtime it runs on.
pub(crate) struct GrpcClient {
    runtime: tokio::runtime::Runtime,
    client: ProfilesServiceClient<Channel>,
    metadata: Vec<(MetadataKey<tonic::metadata::Ascii>, AsciiMetadataValue)>,
}

impl GrpcClient {
    /// A client of `endpoint` (e.g. `http://localhost:4317`); `headers` become request
    /// metadata (the HTTP body headers `content-type` and `content-encoding` aside).
    pub(crate) fn new(
        endpoint: &Url,
        headers: &HeaderMap,
        timeout: Duration,
        gzip: bool,
        tls: &ClientTls,
    ) -> Result<GrpcClient, String> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("starting the gRPC runtime: {e}"))?;
        let channel = {
            let _entered = runtime.enter();
            crate::export::grpc_channel::channel(endpoint.as_str(), timeout, tls)?
        };
        let mut metadata = Vec::new();
        for (name, value) in headers {
            if name == reqwest::header::CONTENT_TYPE || name == reqwest::header::CONTENT_ENCODING {
                continue;
            }
            let key = MetadataKey::from_bytes(name.as_str().as_bytes())
                .map_err(|_| format!("header {name} is not valid gRPC metadata"))?;
            let value = AsciiMetadataValue::try_from(value.as_bytes())
                .map_err(|_| format!("the value of header {name} is not valid gRPC metadata"))?;
            metadata.push((key, value));
        }
        let client = ProfilesServiceClient::new(channel);
        let client = if gzip {
            client.send_compressed(CompressionEncoding::Gzip)
        } else {
            client
        };
        Ok(GrpcClient {
            runtime,
            client,
            metadata,
        })
    }

    /// Sends one encoded `ExportProfilesServiceRequest`. `Ok(Some(message))` is a partial
    /// success; `Err` carries the status code and message.
    pub(crate) fn export(
        &mut self,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Option<String>, (tonic::Code, String)> {
        let request = ExportProfilesServiceRequest::decode(body).map_err(|e| {
            (
                tonic::Code::Internal,
                format!("cannot decode the request: {e}"),
            )
        })?;
        let mut request = tonic::Request::new(request);
        request.set_timeout(timeout);
        for (key, value) in &self.metadata {
            request.metadata_mut().insert(key.clone(), value.clone());
        }
        let client = &mut self.client;
        let answer = self.runtime.block_on(client.export(request));
        match answer {
            Ok(response) => Ok(response.into_inner().partial_success.and_then(|p| {
                (p.rejected_profiles != 0 || !p.error_message.is_empty()).then(|| {
                    format!(
                        "{} profile(s) rejected{}",
                        p.rejected_profiles,
                        if p.error_message.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", p.error_message)
                        }
                    )
                })
            })),
            Err(status) => Err((status.code(), status.message().to_string())),
        }
    }
}
