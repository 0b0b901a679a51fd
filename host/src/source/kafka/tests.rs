use super::*;
use rdkafka::ClientContext as _;
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::RDKafkaErrorCode;

#[test]
fn a_log_line_served_from_the_consumers_queue_is_an_event_not_the_queues_end() {
    let context = SourceContext::default();
    let events = || context.events.load(Ordering::Acquire);
    let before = events();
    context.log(
        RDKafkaLogLevel::Info,
        "FAIL",
        "127.0.0.1:9096/1: Connect to ipv4#127.0.0.1:9096 failed: Connection refused",
    );
    assert_eq!(events(), before + 1);
}

#[test]
fn a_queue_is_served_past_log_lines_and_errors_to_its_end() {
    // 300 log lines and errors of a minute cut off, then records: one fetch serves all.
    let mut script = vec![Polled::Served; 300];
    script.extend([Polled::Served, Polled::Served, Polled::Empty]);
    let mut script = script.into_iter();
    let mut polls = 0;
    let more = serve_queue(4096, || {
        polls += 1;
        script.next().unwrap_or(Polled::Empty)
    });
    assert!(!more, "the queue's end was reached");
    assert_eq!(polls, 303);
    let mut polls = 0;
    assert!(serve_queue(10, || {
        polls += 1;
        Polled::Served
    }));
    assert_eq!(polls, 10, "at most max events, then more may wait");
    assert!(serve_queue(10, || Polled::Rebalanced));
}

#[test]
fn an_outdated_answer_is_asked_again_and_any_other_is_returned() {
    let mut answers = vec![
        Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Outdated)),
        Err(KafkaError::MetadataFetch(RDKafkaErrorCode::Outdated)),
        Ok((0, 20)),
    ]
    .into_iter();
    let mut asked = 0;
    let end = retry_while_outdated(Duration::from_secs(5), || {
        asked += 1;
        answers.next().expect("asked at most three times")
    });
    assert_eq!(end.ok(), Some((0, 20)));
    assert_eq!(asked, 3);
    let failed: KafkaResult<()> = retry_while_outdated(Duration::from_secs(5), || {
        Err(KafkaError::MetadataFetch(
            RDKafkaErrorCode::UnknownPartition,
        ))
    });
    assert_eq!(
        failed.err().and_then(|e| e.rdkafka_error_code()),
        Some(RDKafkaErrorCode::UnknownPartition)
    );
}

#[test]
fn a_seek_refused_as_outdated_or_before_its_fetcher_started_is_asked_again() {
    let mut answers = vec![
        Err(KafkaError::OffsetFetch(RDKafkaErrorCode::Outdated)),
        Err(KafkaError::OffsetFetch(RDKafkaErrorCode::State)),
        Ok(()),
    ]
    .into_iter();
    let mut asked = 0;
    let seeked = seek_retried(Duration::from_secs(5), || {
        asked += 1;
        answers.next().expect("asked at most three times")
    });
    assert!(seeked.is_ok(), "{seeked:?}");
    assert_eq!(asked, 3);
    let mut asked = 0;
    let failed = seek_retried(Duration::from_secs(5), || {
        asked += 1;
        Err(KafkaError::OffsetFetch(RDKafkaErrorCode::UnknownPartition))
    });
    assert_eq!(
        failed.err().and_then(|e| e.rdkafka_error_code()),
        Some(RDKafkaErrorCode::UnknownPartition)
    );
    assert_eq!(asked, 1, "any other answer is returned at once");
}
