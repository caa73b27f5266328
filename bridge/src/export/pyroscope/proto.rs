//! Wire types of Pyroscope's push API, written by hand with `prost` derives.
//!
//! Field numbers follow grafana/pyroscope `api/push/v1/push.proto` (`PushRequest`,
//! `RawProfileSeries`, `RawSample`) and `api/types/v1/types.proto` (`LabelPair`).
//! `RawProfileSeries.annotations` (3) is left out: distributors drop pushed annotations.
//!
//! The one push.v1 codec of the workspace: the bridge's tests and the integration tests'
//! Pyroscope stand-in and push client use these types too, through the `test-support`
//! feature (`otel_profiling::test_support::push_v1`), which is not part of the API.
//! `field_numbers_match_push_proto` below checks the field numbers byte by byte, apart
//! from prost.

use prost::Message;

/// `push.v1.PushRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PushRequest {
    /// Raw profiles with their series labels.
    #[prost(message, repeated, tag = "1")]
    pub series: Vec<RawProfileSeries>,
}

/// `push.v1.RawProfileSeries`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawProfileSeries {
    /// Series labels.
    #[prost(message, repeated, tag = "1")]
    pub labels: Vec<LabelPair>,
    /// The profiles of this series.
    #[prost(message, repeated, tag = "2")]
    pub samples: Vec<RawSample>,
}

/// `types.v1.LabelPair`.
#[derive(Clone, PartialEq, Eq, prost::Message)]
pub struct LabelPair {
    /// Label name.
    #[prost(string, tag = "1")]
    pub name: String,
    /// Label value.
    #[prost(string, tag = "2")]
    pub value: String,
}

/// `push.v1.RawSample`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct RawSample {
    /// pprof bytes, plain or gzipped (Pyroscope sniffs the gzip header).
    #[prost(bytes = "vec", tag = "1")]
    pub raw_profile: Vec<u8>,
    /// Profile id, a UUID (field `ID` in the .proto).
    #[prost(string, tag = "2")]
    pub id: String,
}

/// The encoded `PushRequest` for one or more profiles of one series (a whole interval's
/// profile, or parts of a split one).
pub(crate) fn encode_push_many(labels: &[LabelPair], profiles: &[(&[u8], String)]) -> Vec<u8> {
    PushRequest {
        series: vec![RawProfileSeries {
            labels: labels.to_vec(),
            samples: profiles
                .iter()
                .map(|(raw, id)| RawSample {
                    raw_profile: raw.to_vec(),
                    id: id.clone(),
                })
                .collect(),
        }],
    }
    .encode_to_vec()
}

/// Two smaller pushes carrying together exactly what `body` (an encoded, uncompressed
/// `PushRequest`) carries: its profiles shared between two halves, or, for a single
/// profile, that profile's samples split in two. `None` when it cannot be made smaller (one
/// profile of one sample, or not a push this exporter can read).
pub(crate) fn split_push(body: &[u8]) -> Option<[Vec<u8>; 2]> {
    let push = PushRequest::decode(body).ok()?;
    let [series] = <[RawProfileSeries; 1]>::try_from(push.series).ok()?;
    let halves: [Vec<RawSample>; 2] = if series.samples.len() > 1 {
        let mut first = series.samples;
        let second = first.split_off(first.len() / 2);
        [first, second]
    } else {
        let only = series.samples.into_iter().next()?;
        let profile = crate::pprof::decode(&only.raw_profile).ok()?;
        if profile.sample.len() < 2 {
            return None;
        }
        let limits = crate::pprof::split::SplitLimits {
            max_samples: profile.sample.len().div_ceil(2),
            max_bytes: usize::MAX,
        };
        let parts = crate::pprof::split::split(&profile, limits);
        let mut encoded = parts.iter().map(crate::pprof::proto::encode_gzip);
        let (Some(Ok(a)), Some(Ok(b)), None) = (encoded.next(), encoded.next(), encoded.next())
        else {
            return None;
        };
        let sample = |raw_profile| RawSample {
            raw_profile,
            id: uuid::Uuid::new_v4().to_string(),
        };
        [vec![sample(a)], vec![sample(b)]]
    };
    let [a, b] = halves;
    let encode = |samples| {
        PushRequest {
            series: vec![RawProfileSeries {
                labels: series.labels.clone(),
                samples,
            }],
        }
        .encode_to_vec()
    };
    Some([encode(a), encode(b)])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_numbers_match_push_proto() {
        let labels = [LabelPair {
            name: "a".into(),
            value: "b".into(),
        }];
        let bytes = encode_push_many(&labels, &[(&[0x1f, 0x8b], "id".into())]);
        // series (1, LEN) { labels (1, LEN) { name (1) "a", value (2) "b" },
        //                   samples (2, LEN) { raw_profile (1) 1f 8b, ID (2) "id" } }
        let expected = [
            0x0a, 18, // series
            0x0a, 6, 0x0a, 1, b'a', 0x12, 1, b'b', // labels
            0x12, 8, 0x0a, 2, 0x1f, 0x8b, 0x12, 2, b'i', b'd', // samples
        ];
        assert_eq!(bytes, expected);
        let back = PushRequest::decode(&bytes[..]).expect("decodes");
        assert_eq!(back.series[0].samples[0].id, "id");
    }
}
