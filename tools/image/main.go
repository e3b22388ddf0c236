// Command image builds planner-operator's release image from a root filesystem directory without
// a container runtime (go-containerregistry writes the layer, config and manifest itself), and
// reads such an image back, so that tools/image.sh can check the artifact it wrote.
//
//	image build --rootfs DIR --out FILE --tag REF [--created RFC3339] [--arch amd64]
//	      [--label KEY=VALUE]... [--owner PATH=UID:GID]...
//	    One layer holding DIR (every entry owned by 0:0 unless --owner says otherwise, mtimes
//	    set to --created, in lexical order, so the same DIR gives the same digest), on an empty
//	    base image, with the operator's entrypoint, user, ports and labels; written as a
//	    docker-archive tarball (docker load -i, podman load -i, crane push FILE REF).
//	image check FILE
//	    Validates the tarball (manifest, config and layer digests, diff IDs) and prints its
//	    image digest, platform and layer sizes.
//	image config FILE FIELD
//	    Prints a field of the image's config: entrypoint, cmd or env (one element a line), user,
//	    workdir, or platform (os/architecture).
//	image extract FILE
//	    Writes the image's flattened root filesystem to stdout as a tar stream.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

const usage = `usage:
  image build --rootfs DIR --out FILE --tag REF [--created RFC3339] [--arch ARCH] [--label KEY=VALUE]... [--owner PATH=UID:GID]...
  image check FILE
  image config FILE entrypoint|cmd|env|user|workdir|platform
  image extract FILE`

func main() {
	if len(os.Args) < 2 {
		fatal(errors.New(usage))
	}
	var err error
	switch os.Args[1] {
	case "build":
		err = build(os.Args[2:])
	case "check":
		err = withFile(os.Args[2:], 0, check)
	case "config":
		err = withFile(os.Args[2:], 1, printConfig)
	case "extract":
		err = withFile(os.Args[2:], 0, extract)
	case "-h", "--help", "help":
		fmt.Println(usage)
	default:
		err = fmt.Errorf("unknown command %q\n%s", os.Args[1], usage)
	}
	if err != nil {
		fatal(err)
	}
}

func fatal(err error) {
	fmt.Fprintf(os.Stderr, "image: %v\n", err)
	os.Exit(1)
}

// listFlag collects a repeated flag.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

type owner struct{ uid, gid int }

func build(args []string) error {
	fset := flag.NewFlagSet("build", flag.ContinueOnError)
	rootfs := fset.String("rootfs", "", "directory holding the image's root filesystem")
	out := fset.String("out", "", "docker-archive tarball to write")
	tag := fset.String("tag", "", "image reference recorded in the tarball, e.g. ghcr.io/org/name:1.0.0")
	created := fset.String("created", "1970-01-01T00:00:00Z", "creation time (RFC 3339) of the image and of every file in it")
	arch := fset.String("arch", runtime.GOARCH, "architecture of the binaries in --rootfs (GOARCH spelling)")
	var labels, owners listFlag
	fset.Var(&labels, "label", "KEY=VALUE image label (repeatable)")
	fset.Var(&owners, "owner", "PATH=UID:GID owner of a path in the layer; others are 0:0 (repeatable)")
	if err := fset.Parse(args); err != nil {
		return err
	}
	if *rootfs == "" || *out == "" || *tag == "" || fset.NArg() != 0 {
		return errors.New("build needs --rootfs, --out and --tag, and no other arguments")
	}
	when, err := time.Parse(time.RFC3339, *created)
	if err != nil {
		return fmt.Errorf("--created: %w", err)
	}
	when = when.UTC()
	ref, err := name.NewTag(*tag, name.StrictValidation)
	if err != nil {
		return fmt.Errorf("--tag: %w", err)
	}
	labelMap := map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return fmt.Errorf("--label %q is not KEY=VALUE", l)
		}
		labelMap[k] = v
	}
	ownerMap := map[string]owner{}
	for _, o := range owners {
		p, ids, ok := strings.Cut(o, "=")
		u, g, ok2 := strings.Cut(ids, ":")
		uid, err1 := strconv.Atoi(u)
		gid, err2 := strconv.Atoi(g)
		if !ok || !ok2 || err1 != nil || err2 != nil {
			return fmt.Errorf("--owner %q is not PATH=UID:GID", o)
		}
		ownerMap[strings.Trim(p, "/")] = owner{uid, gid}
	}

	layerTar, err := tarDir(*rootfs, when, ownerMap)
	if err != nil {
		return err
	}
	layer, err := tarball.LayerFromOpener(
		func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(layerTar)), nil },
		tarball.WithCompressionLevel(gzip.BestCompression),
		tarball.WithMediaType(types.OCILayer),
	)
	if err != nil {
		return fmt.Errorf("layer: %w", err)
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err = mutate.Append(img, mutate.Addendum{
		Layer: layer,
		History: v1.History{
			Created:   v1.Time{Time: when},
			CreatedBy: "tools/image.sh: the planner-operator release binary, its shared libraries and /etc",
			Comment:   "built without a container runtime (tools/image)",
		},
	})
	if err != nil {
		return fmt.Errorf("appending the layer: %w", err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cfg = cfg.DeepCopy()
	cfg.OS = "linux"
	cfg.Architecture = *arch
	cfg.Created = v1.Time{Time: when}
	cfg.Author = "planner-operator"
	cfg.Config = v1.Config{
		// As gcr.io/distroless/cc-debian12:nonroot and the Dockerfile: the nonroot user, its home.
		User:       "65532:65532",
		WorkingDir: "/home/nonroot",
		Env: []string{
			"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			"SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt",
		},
		Entrypoint: []string{"/usr/local/bin/planner-operator"},
		Cmd:        []string{"run", "--log-format", "json"},
		// 8080: /healthz, /readyz, /metrics; 9443: the admission webhook (HTTPS).
		ExposedPorts: map[string]struct{}{"8080/tcp": {}, "9443/tcp": {}},
		Labels:       labelMap,
	}
	img, err = mutate.ConfigFile(img, cfg)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}

	tmp := *out + ".partial"
	if err := tarball.WriteToFile(tmp, ref, img); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", *out, err)
	}
	if err := os.Rename(tmp, *out); err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	fmt.Printf("%s %s\n", ref, digest)
	return nil
}

// tarDir returns DIR as an uncompressed tar: regular files, directories and symlinks, in lexical
// order, with fixed mtimes and numeric owners, so that its digest depends on the content alone.
func tarDir(dir string, when time.Time, owners map[string]owner) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil || rel == "." {
			return err
		}
		rel = filepath.ToSlash(rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case info.Mode().IsRegular(), info.IsDir():
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s: only regular files, directories and symlinks go into the layer", path)
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = rel
		if info.IsDir() {
			hdr.Name += "/"
		}
		o := owners[rel]
		hdr.Uid, hdr.Gid = o.uid, o.gid
		hdr.Uname, hdr.Gname = "", ""
		hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = when, time.Time{}, time.Time{}
		hdr.Format = tar.FormatPAX
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(path)
			if err != nil {
				return err
			}
			defer f.Close()
			if _, err := io.Copy(tw, f); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("packing %s: %w", dir, err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// withFile runs fn on the image of the docker-archive tarball args[0], with nExtra more args.
func withFile(args []string, nExtra int, fn func(v1.Image, []string) error) error {
	if len(args) != 1+nExtra {
		return errors.New(usage)
	}
	img, err := tarball.ImageFromPath(args[0], nil)
	if err != nil {
		return fmt.Errorf("reading %s: %w", args[0], err)
	}
	return fn(img, args[1:])
}

func check(img v1.Image, _ []string) error {
	if err := validate.Image(img); err != nil {
		return fmt.Errorf("invalid image: %w", err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var compressed, uncompressed int64
	for _, l := range layers {
		size, err := l.Size()
		if err != nil {
			return err
		}
		compressed += size
		rc, err := l.Uncompressed()
		if err != nil {
			return err
		}
		n, err := io.Copy(io.Discard, rc)
		rc.Close()
		if err != nil {
			return err
		}
		uncompressed += n
	}
	fmt.Printf("digest %s\nplatform %s/%s\nlayers %d: %d bytes compressed, %d bytes of tar\n",
		digest, cfg.OS, cfg.Architecture, len(layers), compressed, uncompressed)
	return nil
}

func printConfig(img v1.Image, args []string) error {
	cfg, err := img.ConfigFile()
	if err != nil {
		return err
	}
	var lines []string
	switch args[0] {
	case "entrypoint":
		lines = cfg.Config.Entrypoint
	case "cmd":
		lines = cfg.Config.Cmd
	case "env":
		lines = cfg.Config.Env
	case "user":
		lines = []string{cfg.Config.User}
	case "workdir":
		lines = []string{cfg.Config.WorkingDir}
	case "platform":
		lines = []string{cfg.OS + "/" + cfg.Architecture}
	default:
		return fmt.Errorf("unknown config field %q (entrypoint, cmd, env, user, workdir, platform)", args[0])
	}
	for _, l := range lines {
		if strings.ContainsRune(l, '\n') {
			return fmt.Errorf("%s holds a newline, which one element a line cannot show: %q", args[0], l)
		}
		fmt.Println(l)
	}
	return nil
}

func extract(img v1.Image, _ []string) error {
	rc := mutate.Extract(img)
	defer rc.Close()
	_, err := io.Copy(os.Stdout, rc)
	return err
}
