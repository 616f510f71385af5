package cri

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"

	"github.com/berth-runtime/berth/cri/errkind"
	"github.com/berth-runtime/berth/image"
)

// The extension is a gRPC service for what the CRI lacks (offline image
// import). Its descriptor is written by hand and its messages are CRI messages,
// so berth needs no protoc step and no .proto file of its own.
const (
	extensionService = "berth.v1.Images"
	importMethod     = "/" + extensionService + "/Import"
)

// ExtensionServer is berth.v1.Images.
type ExtensionServer interface {
	// Import stores the images of an OCI layout directory or a docker-save
	// tarball; req.Image is its absolute path on berthd's host.
	Import(ctx context.Context, req *runtimeapi.ImageSpec) (*runtimeapi.ListImagesResponse, error)
}

// ExtensionClient calls berth.v1.Images.
type ExtensionClient interface {
	Import(ctx context.Context, req *runtimeapi.ImageSpec, opts ...grpc.CallOption) (*runtimeapi.ListImagesResponse, error)
}

// RegisterExtensionServer registers srv on s.
func RegisterExtensionServer(s grpc.ServiceRegistrar, srv ExtensionServer) {
	s.RegisterService(&extensionDesc, srv)
}

var extensionDesc = grpc.ServiceDesc{
	ServiceName: extensionService,
	HandlerType: (*ExtensionServer)(nil),
	Methods:     []grpc.MethodDesc{{MethodName: "Import", Handler: importHandler}},
	Metadata:    "cri/extension.go",
}

// importHandler is what protoc-gen-go-grpc would generate for a unary method.
func importHandler(srv any, ctx context.Context, dec func(any) error, icpt grpc.UnaryServerInterceptor) (any, error) {
	in := new(runtimeapi.ImageSpec)
	if err := dec(in); err != nil {
		return nil, err
	}
	if icpt == nil {
		return srv.(ExtensionServer).Import(ctx, in)
	}
	info := &grpc.UnaryServerInfo{Server: srv, FullMethod: importMethod}
	return icpt(ctx, in, info, func(ctx context.Context, req any) (any, error) {
		return srv.(ExtensionServer).Import(ctx, req.(*runtimeapi.ImageSpec))
	})
}

type extensionClient struct{ cc grpc.ClientConnInterface }

// NewExtensionClient returns a client of berth.v1.Images on cc.
func NewExtensionClient(cc grpc.ClientConnInterface) ExtensionClient {
	return extensionClient{cc}
}

func (c extensionClient) Import(ctx context.Context, req *runtimeapi.ImageSpec, opts ...grpc.CallOption) (*runtimeapi.ListImagesResponse, error) {
	out := new(runtimeapi.ListImagesResponse)
	if err := c.cc.Invoke(ctx, importMethod, req, out, opts...); err != nil {
		return nil, err
	}
	return out, nil
}

// Importer is the part of *image.Service the extension uses.
type Importer interface {
	Import(ctx context.Context, path string) ([]*image.Image, error)
}

type extension struct{ images Importer }

// NewExtensionServer serves berth.v1.Images from images (an *image.Service).
func NewExtensionServer(images Importer) ExtensionServer {
	return extension{images}
}

func (e extension) Import(ctx context.Context, req *runtimeapi.ImageSpec) (*runtimeapi.ListImagesResponse, error) {
	path := req.GetImage()
	// The path is resolved by berthd, whose working directory the client
	// does not know: only an absolute path means what the user meant.
	if !filepath.IsAbs(path) {
		return nil, status.Errorf(codes.InvalidArgument, "import %q: image must be an absolute path on the berthd host", path)
	}
	if _, err := os.Stat(path); err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err // the path is named once, below
		}
		// Missing: the caller's mistake; unreadable (EACCES on a
		// root-squashed NFS, EIO): the node's.
		return nil, grpcError(errkind.PathErrorf(err, "import %s: %w", path, err))
	}
	imgs, err := e.images.Import(ctx, path)
	if err != nil {
		return nil, grpcError(withPath(path, err))
	}
	resp := &runtimeapi.ListImagesResponse{Images: make([]*runtimeapi.Image, 0, len(imgs))}
	for _, img := range imgs {
		resp.Images = append(resp.Images, toCRIImage(img))
	}
	return resp, nil
}

// withPath names the path unless the image package's message already does.
func withPath(path string, err error) error {
	if strings.Contains(err.Error(), path) {
		return err
	}
	return fmt.Errorf("import %s: %w", path, err)
}

// toCRIImage converts a stored image to its CRI form. The user is split into
// uid or username the way the kubelet expects (it checks runAsNonRoot on them).
func toCRIImage(img *image.Image) *runtimeapi.Image {
	out := &runtimeapi.Image{
		Id:          img.ID,
		RepoTags:    img.RepoTags,
		RepoDigests: img.RepoDigests,
		Size:        img.Size,
		Spec:        &runtimeapi.ImageSpec{Image: img.ID},
		Pinned:      img.Pinned,
	}
	// "user", "uid", "user:group" or "uid:gid"; only the user part matters here.
	if user, _, _ := strings.Cut(img.Config.Config.User, ":"); user != "" {
		if uid, err := strconv.ParseInt(user, 10, 64); err == nil {
			out.Uid = &runtimeapi.Int64Value{Value: uid}
		} else {
			out.Username = user
		}
	}
	return out
}
