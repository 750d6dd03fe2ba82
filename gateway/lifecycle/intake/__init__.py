"""What comes in: the upload spec, the streamed upload, uploads as jobs."""
