# A single-server Consul agent for developing and trying idgen's cluster mode
# on one machine. Not for production: one server (no fault tolerance), no TLS,
# no gossip encryption; everything listens on loopback only.
#
# Start it from the repository root (data_dir below is relative to it):
#
#   consul agent -config-file consul/agent-dev.hcl
#
# Then, in a second shell, bootstrap ACLs and make the tokens (once per
# data_dir; data/ is git-ignored):
#
#   # The initial management token. Keep it; it can do anything.
#   consul acl bootstrap | tee data/consul-bootstrap.txt
#   export CONSUL_HTTP_TOKEN=$(awk '/SecretID/ {print $2}' data/consul-bootstrap.txt)
#
#   # The agent's own token, so it may register its node (default_policy is
#   # deny). enable_token_persistence below keeps it across agent restarts.
#   consul acl token create -description "agent idgen-dev" \
#       -node-identity "idgen-dev:dc1" | awk '/SecretID/ {print $2}' > data/agent.token
#   consul acl set-agent-token agent "$(cat data/agent.token)"
#
#   # idgen's token, with the minimal policy in consul/acl-policy.hcl.
#   consul acl policy create -name idgen -rules @consul/acl-policy.hcl
#   consul acl token create -description "idgen node" -policy-name idgen \
#       | awk '/SecretID/ {print $2}' > data/idgen.token
#
# idgen reads the token with consul.token_file = "data/idgen.token".
# consul/README.md, "Run a 3-node idgen cluster", continues from here.

datacenter       = "dc1"
node_name        = "idgen-dev"
server           = true
bootstrap_expect = 1
data_dir         = "data/consul"
log_level        = "INFO"

# Gossip and server RPC on loopback (also avoids the "multiple private IPv4
# addresses" start-up error on machines with several interfaces).
bind_addr = "127.0.0.1"

# HTTP API, DNS and UI on loopback. idgen talks plain HTTP to this agent
# (consul.address = "http://127.0.0.1:8500"); it has no HTTPS client.
client_addr = "127.0.0.1"

# The web UI at http://127.0.0.1:8500/ui (log in with a token).
ui_config {
  enabled = true
}

ports {
  http = 8500
  dns  = 8600
  # Consul's gRPC port serves Envoy (xDS) only, and idgen does not use it.
  # The gRPC health check of an idgen node is the agent dialling idgen's own
  # gRPC port, which needs no Consul port at all.
  grpc = -1
}

acl {
  enabled        = true
  default_policy = "deny"
  # Tokens set with `consul acl set-agent-token` are saved in data_dir and
  # reloaded when the agent restarts.
  enable_token_persistence = true
}
