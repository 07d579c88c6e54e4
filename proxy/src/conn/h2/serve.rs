//! A stream's request as the HTTP/1.1 request loop takes it: its head rendered in place into a pooled exchange's client buffer (taken parsed), or as text the loop parses (RFC 9113 §8.3.1), and the loop run once over the stream's in-memory client.

use std::rc::Rc;

use super::super::state::{self, Held, State};
use super::super::{head, shard, Conn, Exchange};
use super::{render, stream};
use crate::http::respond::status_for;
use crate::observe::decision::Decision;

/// A stream's request head, as the request loop takes it.
pub(super) enum StreamHead {
    /// Written into the client buffer of the exchange it is handled in,
    /// with its pieces' spans: assembled, not parsed again.
    InPlace(Held),
    /// Rendered as text for the loop to read and parse, as from a socket:
    /// it did not fit the client buffer or the field slots, or no
    /// exchange could be taken here (the loop then answers 503).
    Text,
}

/// The stream's request head (see [`StreamHead`]), the bytes its client
/// starts with (the text head, or none), and whether its body goes
/// chunked; `Err` for a request HTTP/1.1 cannot carry.
pub(super) fn stream_head<'a, F>(
    shard: &Rc<shard::Shard>,
    li: usize,
    req: &render::Req<'a, F>,
    has_body: bool,
) -> Result<(StreamHead, Vec<u8>, bool), render::Unfit>
where
    F: Copy + IntoIterator<Item = (&'a [u8], &'a [u8])>,
{
    if let Ok(mut x) = state::take(shard, li) {
        let slots = shard.rt.request_limits.header_slots();
        let ex: &mut Exchange = &mut x;
        if let Some(chunked) =
            render::render_in_place(req, has_body, ex.cl.spare(), &mut ex.req, slots)?
        {
            let n = ex.req.head_len;
            ex.cl.filled(n);
            // Body bytes come in a pooled buffer, as after a text head.
            let body = if has_body {
                stream::take_request_buffer()
            } else {
                Vec::new()
            };
            return Ok((StreamHead::InPlace(x), body, chunked));
        }
    }
    let mut text = stream::take_request_buffer();
    let r = render::render_request(req, has_body, &mut text)?;
    Ok((StreamHead::Text, text, r.chunked))
}

/// The request loop, once, over the stream's client. Returns whether the
/// connection limit refused the request.
pub(super) async fn serve_stream(conn: &mut Conn, head: StreamHead) -> bool {
    let read = match head {
        StreamHead::InPlace(mut x) => {
            let shard = conn.shard.clone();
            let ex: &mut Exchange = &mut x;
            match shard.req_parser.assemble(ex.cl.bytes(), &mut ex.req) {
                Some(Ok(())) => head::HeadRead::Ready(x),
                Some(Err(e)) => head::HeadRead::Bad(e, x),
                // What the parser might answer otherwise: it reads the
                // same bytes, as from any client.
                None => conn.read_head(true, State::Busy(x)).await,
            }
        }
        StreamHead::Text => conn.read_head(true, State::Idle).await,
    };
    match read {
        head::HeadRead::Ready(x) => {
            let shard = conn.shard.clone();
            let (_, x) = shard.request_futures.run(|| conn.handle_request(x)).await;
            x.rec.decision == Decision::ConnLimited
        }
        head::HeadRead::Bad(e, x) => {
            Box::pin(conn.refuse_and_close(x, status_for(e), Decision::BadRequest(e))).await;
            false
        }
        head::HeadRead::TimedOut(x) => {
            Box::pin(conn.refuse_and_close(x, 408, Decision::ClientTimeout)).await;
            false
        }
        head::HeadRead::Closed => false,
    }
}
