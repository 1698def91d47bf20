"""Weight movement, one package and one unit (MiB, as users write `bucket_mb`): buckets and
digests, the receiver's dual buffer, NCCL transfer and its layout. torch only, no ray."""
