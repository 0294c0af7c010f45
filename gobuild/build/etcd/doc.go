package etcdbuild
