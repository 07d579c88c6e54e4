//! What the codec refused, counted by reason in `zgix_h2_refused_total`: its connection errors (`ConnError::reason`: the GOAWAY's cause, RFC 9113 §5.4.1, §6.8) and its stream errors (`Stats`: RST_STREAM, §5.4.2), by the table in the codec's README, so the metric's labels stay what they were over the `h2` crate.

use zgix_h2::server::{ConnError, Reason, Stats};

use crate::observe::metrics::ListenerCounters;

/// Index into `H2_REFUSALS`.
#[derive(Copy, Clone)]
pub(super) enum Refusal {
    BadPreface = 0,
    RapidReset = 1,
    Calm = 2,
    Hpack = 3,
    Protocol = 4,
    FlowControl = 5,
    FrameSize = 6,
    RefusedStream = 7,
    StreamError = 8,
    SettingsFlood = 9,
    PingFlood = 10,
    HeaderList = 11,
}

/// The label a connection error counts under; `None` for zgix's own end.
fn refusal(r: Reason) -> Option<Refusal> {
    Some(match r {
        Reason::BadPreface => Refusal::BadPreface,
        Reason::RapidReset => Refusal::RapidReset,
        Reason::PingFlood => Refusal::PingFlood,
        Reason::SettingsFlood => Refusal::SettingsFlood,
        Reason::Hpack => Refusal::Hpack,
        Reason::Protocol => Refusal::Protocol,
        Reason::FlowControl => Refusal::FlowControl,
        Reason::FrameSize => Refusal::FrameSize,
        Reason::StreamErrors
        | Reason::EmptyFrames
        | Reason::HeaderFlood
        | Reason::ControlBacklog => Refusal::Calm,
        Reason::Local => return None,
    })
}

pub(super) fn count(c: &ListenerCounters, why: Refusal) {
    c.h2_refused[why as usize].inc();
}

/// Counts the connection error that ended the connection.
pub(super) fn count_error(c: &ListenerCounters, e: ConnError) {
    if let Some(why) = refusal(e.reason) {
        count(c, why);
    }
}

/// Counts the stream errors since `last` (the codec's totals then).
pub(super) fn count_stats(c: &ListenerCounters, last: &mut Stats, now: Stats) {
    let r = &c.h2_refused;
    r[Refusal::RefusedStream as usize].add(now.refused_streams - last.refused_streams);
    r[Refusal::StreamError as usize].add(now.stream_errors - last.stream_errors);
    r[Refusal::HeaderList as usize].add(now.headers_too_large - last.headers_too_large);
    *last = now;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flood_is_calm_and_zgixs_own_end_is_not_counted() {
        for r in [
            Reason::StreamErrors,
            Reason::EmptyFrames,
            Reason::HeaderFlood,
            Reason::ControlBacklog,
        ] {
            assert!(matches!(refusal(r), Some(Refusal::Calm)), "{r:?}");
        }
        assert!(refusal(Reason::Local).is_none());
        assert!(matches!(
            refusal(Reason::RapidReset),
            Some(Refusal::RapidReset)
        ));
    }
}
