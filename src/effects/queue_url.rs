//! Which queue a queue URL or an ARN names, so two spellings of one queue compare equal.

/// The queue a URL or an ARN names: its account and name, and its region when known.
struct QueueUrl<'a> {
    region: Option<&'a str>,
    account: &'a str,
    name: &'a str,
}

impl QueueUrl<'_> {
    /// The same account and name (queue names are case-sensitive), in the same region when
    /// both name one. The host does not tell queues apart: one SQS client, with one endpoint,
    /// sends to both.
    fn same_queue(&self, other: &QueueUrl<'_>) -> bool {
        let same_region = self
            .region
            .zip(other.region)
            .is_none_or(|(a, b)| a.eq_ignore_ascii_case(b));
        self.account == other.account && self.name == other.name && same_region
    }
}

/// What queue URL `url` (`https://HOST/ACCOUNT/NAME`) names: the region when the host names
/// one (`sqs.REGION.…`, `REGION.queue.…`) or the path does (path-style
/// `/queue/REGION/ACCOUNT/NAME`), and the account and name, the last two path segments
/// (doubled slashes name the same queue).
fn url_parts(url: &str) -> Option<QueueUrl<'_>> {
    let url = url.trim();
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let parts: Vec<&str> = rest.split('/').filter(|p| !p.is_empty()).collect();
    let [host, ref path @ .., account, name] = parts[..] else {
        return None;
    };
    let labels: Vec<&str> = host.split('.').collect();
    let is = |label: &str, word: &str| label.eq_ignore_ascii_case(word);
    // `sqs.REGION.…` anywhere in the host (VPC endpoints put it after their own label),
    // `REGION.queue.…`, or path-style `/queue/REGION/…`.
    let region = labels
        .windows(2)
        .find_map(|w| match w {
            [s, r] if is(s, "sqs") && is_region(r) => Some(*r),
            [r, q] if is(q, "queue") && is_region(r) => Some(*r),
            _ => None,
        })
        .or(match path {
            [.., q, r] if is(q, "queue") && is_region(r) => Some(*r),
            _ => None,
        });
    Some(QueueUrl {
        region,
        account,
        name,
    })
}

/// Whether a label is shaped as an AWS region: letters, then words, then a number
/// (`us-east-1`, `us-gov-west-1`, `cn-north-1`), so that another host's dashed label (a
/// proxy's `sqs.egress-proxy.…`) is not read as one.
fn is_region(label: &str) -> bool {
    let parts: Vec<&str> = label.split('-').collect();
    let [first, middle @ .., last] = &parts[..] else {
        return false;
    };
    !middle.is_empty()
        && first.len() == 2
        && first.bytes().all(|b| b.is_ascii_alphabetic())
        && middle
            .iter()
            .all(|w| !w.is_empty() && w.bytes().all(|b| b.is_ascii_alphabetic()))
        && !last.is_empty()
        && last.bytes().all(|b| b.is_ascii_digit())
}

/// True when two queue URLs name one queue: the same text but for a trailing `/`, or the same
/// queue by [`QueueUrl::same_queue`].
pub fn urls_name_one_queue(a: &str, b: &str) -> bool {
    let norm = |u: &str| u.trim().trim_end_matches('/').to_owned();
    norm(a) == norm(b)
        || url_parts(a)
            .zip(url_parts(b))
            .is_some_and(|(a, b)| a.same_queue(&b))
}

/// True when queue URL `url` (`https://HOST/ACCOUNT/NAME`) names the queue of `arn`
/// (`arn:PARTITION:sqs:REGION:ACCOUNT:NAME`): the same account and name, and the same region
/// when the host names one (`sqs.REGION.…` or `REGION.queue.…`).
pub(crate) fn url_names_arn(url: &str, arn: &str) -> bool {
    let arn: Vec<&str> = arn.split(':').collect();
    let [_, _, _, region, account, name] = arn[..] else {
        return false;
    };
    let arn = QueueUrl {
        region: Some(region),
        account,
        name,
    };
    url_parts(url).is_some_and(|u| u.same_queue(&arn))
}

#[cfg(test)]
mod url_tests {
    use super::{url_names_arn, urls_name_one_queue};

    #[test]
    fn a_queue_url_names_an_arn_by_account_name_and_region() {
        let arn = "arn:aws:sqs:us-east-1:123456789012:jobs-dlq";
        for url in [
            "https://sqs.us-east-1.amazonaws.com/123456789012/jobs-dlq",
            "https://us-east-1.queue.amazonaws.com/123456789012/jobs-dlq",
            "http://127.0.0.1:45660/123456789012/jobs-dlq/",
            "http://localhost:4566/123456789012/jobs-dlq",
            // Path-style and doubled slashes (LocalStack, hand-written URLs).
            "http://localhost:4566/queue/us-east-1/123456789012/jobs-dlq",
            "https://sqs.us-east-1.amazonaws.com//123456789012/jobs-dlq",
            // A VPC endpoint, FIPS and dual-stack hosts, LocalStack's regional host.
            "https://vpce-0a1b2c3d-4e5f6g7h.sqs.us-east-1.vpce.amazonaws.com/123456789012/jobs-dlq",
            "https://sqs-fips.us-east-1.amazonaws.com/123456789012/jobs-dlq",
            "https://sqs.us-east-1.api.aws/123456789012/jobs-dlq",
            "http://sqs.us-east-1.localhost.localstack.cloud:4566/123456789012/jobs-dlq",
            // A proxy whose host has a dashed label after `sqs`: no region read from it.
            "https://sqs.egress-proxy.corp.example/123456789012/jobs-dlq",
        ] {
            assert!(url_names_arn(url, arn), "{url}");
        }
        for url in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs-dlq",
            "https://vpce-0a1b2c3d-4e5f6g7h.sqs.eu-west-1.vpce.amazonaws.com/123456789012/jobs-dlq",
            "https://sqs.us-east-1.amazonaws.com/210987654321/jobs-dlq",
            "https://sqs.us-east-1.amazonaws.com/123456789012/jobs",
            "https://sqs.us-east-1.amazonaws.com/jobs-dlq",
            "not a url",
        ] {
            assert!(!url_names_arn(url, arn), "{url}");
        }
        assert!(!url_names_arn(
            "https://sqs.us-east-1.amazonaws.com/123456789012/jobs-dlq",
            "jobs-dlq"
        ));
    }

    #[test]
    fn two_queue_urls_name_one_queue_by_account_and_name() {
        let url = "https://sqs.us-east-1.amazonaws.com/123456789012/jobs";
        for other in [
            "HTTPS://SQS.US-EAST-1.AMAZONAWS.COM/123456789012/jobs/",
            "https://us-east-1.queue.amazonaws.com/123456789012/jobs",
            "https://queue.amazonaws.com/123456789012/jobs",
            "http://localhost:4566/queue/us-east-1/123456789012/jobs",
            "https://sqs.us-east-1.amazonaws.com//123456789012/jobs",
        ] {
            assert!(urls_name_one_queue(url, other), "{other}");
            assert!(urls_name_one_queue(other, url), "{other}");
        }
        for other in [
            "https://sqs.eu-west-1.amazonaws.com/123456789012/jobs",
            "https://sqs.us-east-1.amazonaws.com/210987654321/jobs",
            "https://sqs.us-east-1.amazonaws.com/123456789012/jobs-dlq",
            "https://sqs.us-east-1.amazonaws.com/123456789012/Jobs",
            "http://localhost:4566/queue/eu-west-1/123456789012/jobs",
            "jobs",
        ] {
            assert!(!urls_name_one_queue(url, other), "{other}");
        }
        // Without a region the host does not tell them apart: one client sends to both.
        let local = "http://localhost:4566/123456789012/jobs";
        assert!(urls_name_one_queue(
            local,
            "http://127.0.0.1:4566/123456789012//jobs"
        ));
        assert!(!urls_name_one_queue(
            local,
            "http://localhost:4566/123456789012/jobs-dlq"
        ));
    }
}
