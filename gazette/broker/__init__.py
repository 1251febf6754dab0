"""The journal broker: replicas, append and read paths, fragments and their stores."""
