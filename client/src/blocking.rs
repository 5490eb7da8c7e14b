//! The client for code without an async runtime: it runs its own small
//! tokio runtime. Do not call it from inside a tokio runtime (use
//! [`crate::Client`] there).
//!
//! ```no_run
//! # fn run() -> Result<(), idgen_client::Error> {
//! use idgen_client::{blocking::BlockingClient, Client, Mode};
//! let client = BlockingClient::connect(Client::builder().endpoints(["127.0.0.1:50051"]))?;
//! let ids = client.prefetcher(Mode::Snowflake, "")?;
//! let id = ids.next_id()?;
//! # let _ = id; Ok(()) }
//! ```

use crate::{
    Client, ClientBuilder, DecodeIdResponse, Error, GenFormattedResponse, GetFormatCounterResponse,
    Mode, ParseFormattedResponse, Prefetcher, Uuid, UuidPrefetcher,
};

/// A [`Client`] with blocking methods.
#[derive(Debug)]
pub struct BlockingClient {
    client: Client,
    // Dropped last: the client's background tasks run on it.
    runtime: tokio::runtime::Runtime,
}

impl BlockingClient {
    /// Builds the client on a runtime of its own (one worker thread).
    pub fn connect(builder: ClientBuilder) -> Result<Self, Error> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("idgen-client")
            .enable_all()
            .build()
            .map_err(|e| Error::Config(format!("cannot start the client's runtime: {e}")))?;
        let client = runtime.block_on(builder.build())?;
        Ok(Self { client, runtime })
    }

    /// See [`Client::gen_id`].
    pub fn gen_id(&self, mode: Mode, tag: &str) -> Result<u64, Error> {
        self.runtime.block_on(self.client.gen_id(mode, tag))
    }

    /// See [`Client::gen_ids`].
    pub fn gen_ids(&self, mode: Mode, tag: &str, count: u32) -> Result<Vec<u64>, Error> {
        self.runtime.block_on(self.client.gen_ids(mode, tag, count))
    }

    /// See [`Client::gen_formatted`].
    pub fn gen_formatted(
        &self,
        format: &str,
        params: impl IntoIterator<Item = (impl Into<String>, impl Into<String>)>,
        count: u32,
    ) -> Result<GenFormattedResponse, Error> {
        self.runtime
            .block_on(self.client.gen_formatted(format, params, count))
    }

    /// See [`Client::parse_formatted`].
    pub fn parse_formatted(&self, format: &str, id: &str) -> Result<ParseFormattedResponse, Error> {
        self.runtime
            .block_on(self.client.parse_formatted(format, id))
    }

    /// See [`Client::decode_id`].
    pub fn decode_id(&self, id: u64, mode: Mode) -> Result<DecodeIdResponse, Error> {
        self.runtime.block_on(self.client.decode_id(id, mode))
    }

    /// See [`Client::decode_segment_id`].
    pub fn decode_segment_id(&self, tag: &str, id: u64) -> Result<DecodeIdResponse, Error> {
        self.runtime
            .block_on(self.client.decode_segment_id(tag, id))
    }

    /// See [`Client::format_counter`].
    pub fn format_counter(
        &self,
        format: &str,
        params: impl IntoIterator<Item = (impl Into<String>, impl Into<String>)>,
    ) -> Result<GetFormatCounterResponse, Error> {
        self.runtime
            .block_on(self.client.format_counter(format, params))
    }

    /// See [`Client::next_id`].
    pub fn next_id(&self, mode: Mode, tag: &str) -> Result<u64, Error> {
        if mode != Mode::Strict {
            if let Some(id) = self.client.prefetcher(mode, tag)?.try_next() {
                return Ok(id);
            }
        }
        self.runtime.block_on(self.client.next_id(mode, tag))
    }

    /// See [`Client::prefetcher`].
    pub fn prefetcher(&self, mode: Mode, tag: &str) -> Result<BlockingPrefetcher, Error> {
        Ok(BlockingPrefetcher {
            prefetcher: self.client.prefetcher(mode, tag)?,
            runtime: self.runtime.handle().clone(),
        })
    }

    /// See [`Client::next_uuid`].
    pub fn next_uuid(&self) -> Result<Uuid, Error> {
        self.uuid_prefetcher().next_uuid()
    }

    /// See [`Client::uuid_prefetcher`].
    pub fn uuid_prefetcher(&self) -> BlockingUuidPrefetcher {
        BlockingUuidPrefetcher {
            prefetcher: self.client.uuid_prefetcher(),
            runtime: self.runtime.handle().clone(),
        }
    }

    /// The async client underneath.
    pub fn client(&self) -> &Client {
        &self.client
    }
}

/// A [`Prefetcher`] with a blocking `next_id`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct BlockingPrefetcher {
    prefetcher: Prefetcher,
    runtime: tokio::runtime::Handle,
}

impl BlockingPrefetcher {
    /// The next ID: from memory without a lock when the buffer holds one,
    /// else blocks until the refill lands (within the deadline).
    pub fn next_id(&self) -> Result<u64, Error> {
        match self.prefetcher.try_next() {
            Some(id) => Ok(id),
            None => self.runtime.block_on(self.prefetcher.next_id()),
        }
    }

    /// The async prefetcher underneath.
    pub fn prefetcher(&self) -> &Prefetcher {
        &self.prefetcher
    }
}

/// A [`UuidPrefetcher`] with a blocking `next_uuid`. Cheap to clone.
#[derive(Debug, Clone)]
pub struct BlockingUuidPrefetcher {
    prefetcher: UuidPrefetcher,
    runtime: tokio::runtime::Handle,
}

impl BlockingUuidPrefetcher {
    /// The next UUID: from memory without a lock when the buffer holds
    /// one, else blocks until the refill lands (within the deadline).
    pub fn next_uuid(&self) -> Result<Uuid, Error> {
        match self.prefetcher.try_next() {
            Some(uuid) => Ok(uuid),
            None => self.runtime.block_on(self.prefetcher.next_uuid()),
        }
    }

    /// The async prefetcher underneath.
    pub fn prefetcher(&self) -> &UuidPrefetcher {
        &self.prefetcher
    }
}
