//! HPACK (RFC 7541): the decoder of the client's header blocks, with its dynamic table, and the stateless encoder of zgix's responses.

mod decode;
mod encode;
mod huffman;
mod table;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_random;

pub use decode::Decoder;
pub use encode::Encoder;

/// Why a header block did not decode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeError {
    /// RFC 7541 §2.3.3, §4.2, §5.1, §5.2, §6: bad index, bad integer/length, bad Huffman
    /// (EOS, padding > 7 bits or not all ones), a size update over the maximum or not at
    /// the block's start, a truncated block. Connection error COMPRESSION_ERROR (RFC 9113 §4.3).
    Compression,
    /// The decoded list (RFC 9113 §6.5.2: sum of name + value + 32 per field) went over
    /// `max_list`. The whole block WAS still decoded (the dynamic table stays in step with
    /// the client's encoder); `f` was not called for fields past the limit.
    ListTooLarge,
}
