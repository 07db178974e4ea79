"""The metadata service's client side: one service (client, over channel), many shards (sharded,
merge), where the service is (targets, rediskeys)."""
