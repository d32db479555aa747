"""Answer matching, top-k accuracy and IR metrics for retrieval evaluation."""
