// Builds tools/image: writes the release image (tools/image.sh, make image) with
// go-containerregistry, without a container runtime.
module github.com/planner-operator/planner-operator/tools/image

go 1.26.0

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
)
