"""idgen-client: the Python client of idgen, the distributed unique-ID
service. IDs are Python ints (exact over all 64 bits).

    from idgen_client import Client
    client = Client.from_env()      # Consul's variables: CONSUL_HTTP_ADDR, ...
    order_id = client.next_id("snowflake")

See the repository's docs/CLIENT-PYTHON.md."""

from ._aio import AsyncClient
from ._client import Client
from ._consul import ConsulDiscovery, ConsulEnv
from ._errors import (BadAnswerError, ConfigError, CrossesDatacentersError,
                      DeadlineExceededError, DiscoveryError,
                      IdgenError, NoNodesError, RevealRefusedError, StatusError,
                      StrictNotPrefetchableError, TransportError)
from ._hash import key_hash
from ._metrics import Metrics
from ._nodes import TlsConfig
from ._prefetch import PrefetchConfig, Prefetcher

__version__ = "0.1.0"

__all__ = [
    "AsyncClient", "BadAnswerError", "Client", "ConfigError", "ConsulDiscovery", "ConsulEnv",
    "CrossesDatacentersError",
    "DeadlineExceededError", "DiscoveryError", "IdgenError", "Metrics", "NoNodesError",
    "PrefetchConfig", "Prefetcher", "RevealRefusedError", "StatusError",
    "StrictNotPrefetchableError", "TlsConfig", "TransportError", "key_hash",
]
