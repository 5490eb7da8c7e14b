"""Generated gRPC stubs (made at build time from proto/idgen/v1/idgen.proto)."""
