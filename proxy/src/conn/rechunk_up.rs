//! A chunked request body on its way up: validated, re-encoded without extensions or trailers (RFC 9112 §7.1.1, §7.1.2), and sent as a gather list — zgix's framing and the client's data where it lies — in one vectored send per read to a plain upstream (copied when its chunks are too many or too small for one gather list, and for TLS); a large chunk's data goes socket to socket (`bulk.rs`).

use zgix_parser::{ChunkedDecoder, ParseError, Pieces};

use super::body::{many, read_client, relay_up, FRAMING_READ};
use super::client::ClientConn;
use super::shard::Shard;
use super::state::ClientBytes;
use super::{upstream_io, Fail};
use crate::io::Gather;
use crate::upstream::conn::UpConn;

/// The chunked half of [`super::body::Upload`].
pub(super) struct ChunkedUp<'a> {
    pub client: &'a ClientConn,
    pub up: &'a UpConn,
    /// The client's bytes, the head consumed: the body starts here.
    pub cl: &'a mut ClientBytes,
    pub dec: &'a mut ChunkedDecoder,
    pub pieces: &'a mut Pieces,
    /// The re-encoding copied whole, for a TLS upstream.
    pub copy: &'a mut Vec<u8>,
    pub shard: &'a Shard,
}

impl ChunkedUp<'_> {
    /// Streams the body up, leaving the client bytes at the first byte
    /// after it (a pipelined request may follow).
    pub(super) async fn run(self) -> Result<(), Fail> {
        let ChunkedUp {
            client,
            up,
            cl,
            dec,
            pieces,
            copy,
            shard,
        } = self;
        // Both ends plaintext: the data of a large chunk may take the bulk
        // path, and the client's receive mode is left as the last body set
        // it until a chunk is spliced or the body ends without one (as for
        // responses, `body.rs`).
        let bulk = super::bulk::plain(client).zip(super::bulk::plain_up(up));
        if bulk.is_none() {
            many(client);
        }
        let mut spliced = false;
        // RFC 9112 §7.1.1: zgix interprets no chunk extension, so the origin
        // gets the body re-encoded without any (and without trailers): no
        // extension parser of the origin's can disagree with zgix's.
        *dec = ChunkedDecoder::new(shard.rt.request_limits.max_body);
        pieces.reset();
        // Nothing of an earlier body that ended in an error is left.
        copy.clear();
        if up.is_tls() {
            let want = cl.capacity() + zgix_parser::FRAMING_MAX;
            if copy.capacity() < want {
                copy.reserve_exact(want);
            }
        }
        // The CRLF that ends a chunk whose data went on the bulk path, sent
        // with the next framing; and, from that chunk until the next chunk's
        // data, reads of at most FRAMING_READ.
        let (mut crlf, mut framing) = (false, false);
        loop {
            pieces.clear();
            if std::mem::take(&mut crlf) {
                pieces.push_framing(b"\r\n");
            }
            // An error anywhere in the buffered bytes comes back before any
            // piece of them is sent (`rechunk_pieces` checks the rest of a
            // buffer whose pieces do not fit one send).
            let r =
                zgix_parser::rechunk_pieces(dec, cl.bytes(), pieces).map_err(Fail::ClientBad)?;
            // Out of room with bytes left (many small chunks: each is
            // copied into the framing, which fills after ~29 of 64 bytes):
            // this batch is copied out and the rest of the same bytes
            // re-encoded after it, so the whole buffer goes up in one send,
            // not one send (and one upstream round trip) per batch.
            if pieces.is_full() {
                pieces.write_to(cl.bytes(), copy);
                cl.consume(r.consumed);
                continue;
            }
            // All buffered bytes re-encoded and the chunk still owes its
            // rest: that rest goes on as a chunk of its own, its size line
            // here, its data socket to socket, its CRLF with the next
            // framing (the re-encoding `rechunk_pieces` makes: one chunk per
            // data run, no extensions).
            let owed = dec.data_owed();
            let big =
                bulk.filter(|_| r.consumed == cl.pending() && super::bulk::takes_bulk_chunk(owed));
            if big.is_some() {
                pieces.push_size_line(owed);
            }
            send(up, cl, pieces, copy).await?;
            cl.consume(r.consumed);
            if r.done {
                break;
            }
            if let Some((c, u)) = big {
                let lane = super::bulk::lane(c, true);
                relay_up(c, u, owed, cl.scratch(), lane).await?;
                dec.skip_data(owed);
                (spliced, crlf, framing) = (true, true, true);
            } else if owed > 0 {
                framing = false;
            }
            cl.compact();
            if cl.is_full() {
                return Err(Fail::ClientBad(ParseError::BadChunk));
            }
            let spare = cl.spare();
            let room = match framing {
                true => FRAMING_READ.min(spare.len()),
                false => spare.len(),
            };
            let n = read_client(client, &mut spare[..room]).await?;
            cl.filled(n);
        }
        if bulk.is_some() && !spliced {
            many(client);
        }
        Ok(())
    }
}

/// Sends `pieces` (made from `cl.bytes()`) after what `copy` holds (the
/// batches of the same read copied out when they overflowed a gather list).
/// A plain upstream with nothing copied: one vectored send with the data
/// where it lies in the client's buffer (none when every piece is framing,
/// small data copied in: then one plain write). Otherwise, and for TLS, the
/// copying path: the pieces appended to `copy` and the whole written
/// (encrypted for TLS) as one.
async fn send(
    up: &UpConn,
    cl: &ClientBytes,
    pieces: &Pieces,
    copy: &mut Vec<u8>,
) -> Result<(), Fail> {
    if pieces.is_empty() && copy.is_empty() {
        return Ok(());
    }
    let r = match up {
        UpConn::Plain(s) if copy.is_empty() && pieces.has_data() => {
            s.write_all_gather(Gather {
                shared: cl.shared(),
                base: cl.mark(),
                framing: pieces.framing(),
                pieces: pieces.pieces(),
            })
            .await
        }
        UpConn::Plain(s) if copy.is_empty() => s.write_all(pieces.framing()).await,
        _ => {
            pieces.write_to(cl.bytes(), copy);
            let r = up.write_all(&copy[..]).await;
            copy.clear();
            r
        }
    };
    r.map_err(|e| upstream_io(&e))
}
