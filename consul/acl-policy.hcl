# The minimal ACL policy an idgen node's Consul token needs (see consul/README.md for what each rule is for).
# Create it with:
#   consul acl policy create -name idgen -rules @consul/acl-policy.hcl
#   consul acl token create -description "idgen node" -policy-name idgen
# Keys live under idgen/<cluster>/ (workers/, hwm/, ...); change the prefix
# here if you change it in idgen's config.
key_prefix "idgen/"  { policy = "write" }
session_prefix ""    { policy = "write" }
service "idgen"      { policy = "write" }
service_prefix ""    { policy = "read" }
node_prefix ""       { policy = "read" }
