# Images of runwarden's binaries, for those who build with a container engine.
# `make images` builds the same images without one (hack/images.sh).
#
#   docker build --build-arg BINARY=webhook    -t runwarden/webhook:dev .
#   docker build --build-arg BINARY=dispatcher -t runwarden/dispatcher:dev .
#   docker build --build-arg BINARY=postrender -t runwarden/postrender:dev .
ARG GO_VERSION=1.26

FROM golang:${GO_VERSION} AS build
ARG BINARY=webhook
ARG VERSION=devel
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/runwarden/runwarden/internal/version.Version=${VERSION}" \
      -o /out/runwarden-${BINARY} ./${BINARY}

# A static binary on an empty base, as the non-root user 65532.
FROM scratch
ARG BINARY=webhook
LABEL org.opencontainers.image.title="runwarden-${BINARY}" \
      org.opencontainers.image.source="https://github.com/runwarden/runwarden"
COPY --from=build /out/runwarden-${BINARY} /usr/local/bin/runwarden
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/runwarden"]
