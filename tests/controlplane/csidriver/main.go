// Command evi-csi-test-driver is the CSI driver of the end-to-end tests' node: no CSI driver
// module can be fetched on the machines the tests run on, and the kubelet's CSI plugin, the
// ephemeral-volume controller, external-provisioner and the scheduler's volume binding need one
// to do their real work.
//
// It is one process serving the three CSI services and the kubelet's plugin-registration
// service (what node-driver-registrar does for real drivers). Every volume is a directory under
// --data-dir, bind-mounted at the target path the kubelet gives:
//   - a persistent volume (CreateVolume, from external-provisioner) is volumes/<id>, made with
//     the StorageClass parameters in volumes/<id>/.parameters and removed by DeleteVolume;
//   - an inline (ephemeral) volume is inline/<id>, made at NodePublishVolume with the volume's
//     attributes in <id>/.volume-context (key=value lines, sorted) and removed at unpublish.
//
// The directories are world-writable: the tests' tasks run as an arbitrary user.
// It is a test fixture, not a driver to run anywhere else: no capacity, no topology, no staging.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registration "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
	mount "k8s.io/mount-utils"
)

const ephemeralKey = "csi.storage.k8s.io/ephemeral"

type driver struct {
	csi.UnimplementedIdentityServer
	csi.UnimplementedControllerServer
	csi.UnimplementedNodeServer
	registration.UnimplementedRegistrationServer

	name, nodeID, dataDir, csiSocket string
	mu                               sync.Mutex // one volume operation at a time: enough for tests
	// published: the target paths each volume is mounted at. A published volume is not deleted
	// (a real driver's storage refuses too): a PV can be deleted before the kubelet unmounts.
	published map[string]map[string]bool
}

var safeID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,128}$`)

func (d *driver) dir(kind, id string) (string, error) {
	if !safeID.MatchString(id) || id == "." || id == ".." {
		return "", status.Errorf(codes.InvalidArgument, "volume id %q is not a plain name", id)
	}
	return filepath.Join(d.dataDir, kind, id), nil
}

// writeKV writes a map as sorted key=value lines.
func writeKV(path string, kv map[string]string) error {
	keys := make([]string, 0, len(kv))
	for k := range kv {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%s\n", k, kv[k])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

func mkdirOpen(path string) error {
	if err := os.MkdirAll(path, 0o777); err != nil {
		return err
	}
	return os.Chmod(path, 0o777) // past the umask
}

// --- identity ---

func (d *driver) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: d.name, VendorVersion: "0.1.0"}, nil
}

func (d *driver) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{
			Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (d *driver) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

// --- controller ---

func (d *driver) ControllerGetCapabilities(context.Context, *csi.ControllerGetCapabilitiesRequest) (*csi.ControllerGetCapabilitiesResponse, error) {
	return &csi.ControllerGetCapabilitiesResponse{Capabilities: []*csi.ControllerServiceCapability{{
		Type: &csi.ControllerServiceCapability_Rpc{Rpc: &csi.ControllerServiceCapability_RPC{
			Type: csi.ControllerServiceCapability_RPC_CREATE_DELETE_VOLUME}},
	}}}, nil
}

func (d *driver) CreateVolume(_ context.Context, req *csi.CreateVolumeRequest) (*csi.CreateVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dir, err := d.dir("volumes", req.GetName())
	if err != nil {
		return nil, err
	}
	if err := mkdirOpen(dir); err != nil {
		return nil, status.Errorf(codes.Internal, "creating %s: %v", dir, err)
	}
	if err := writeKV(filepath.Join(dir, ".parameters"), req.GetParameters()); err != nil {
		return nil, status.Errorf(codes.Internal, "writing parameters: %v", err)
	}
	size := req.GetCapacityRange().GetRequiredBytes()
	log.Printf("CreateVolume %s (%d bytes) parameters %v", req.GetName(), size, req.GetParameters())
	return &csi.CreateVolumeResponse{Volume: &csi.Volume{
		VolumeId: req.GetName(), CapacityBytes: size, VolumeContext: req.GetParameters(),
	}}, nil
}

func (d *driver) DeleteVolume(_ context.Context, req *csi.DeleteVolumeRequest) (*csi.DeleteVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	dir, err := d.dir("volumes", req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if n := len(d.published[req.GetVolumeId()]); n > 0 {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is still published at %d target(s)", req.GetVolumeId(), n)
	}
	if err := os.RemoveAll(dir); err != nil {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", dir, err)
	}
	log.Printf("DeleteVolume %s", req.GetVolumeId())
	return &csi.DeleteVolumeResponse{}, nil
}

// --- node ---

func (d *driver) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{}, nil
}

func (d *driver) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: d.nodeID}, nil
}

// isMountPoint: whether path is a mount point, as the kubelet's own mount library reads
// /proc/self/mountinfo (a bind mount within one filesystem keeps its device number, so stat
// cannot tell). A path that does not exist is not one.
func isMountPoint(path string) bool {
	notMount, err := mount.IsNotMountPoint(mount.New(""), path)
	return err == nil && !notMount
}

func (d *driver) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	target := req.GetTargetPath()
	if target == "" {
		return nil, status.Error(codes.InvalidArgument, "no target path")
	}
	kind := "volumes"
	if req.GetVolumeContext()[ephemeralKey] == "true" {
		kind = "inline"
	}
	source, err := d.dir(kind, req.GetVolumeId())
	if err != nil {
		return nil, err
	}
	if kind == "inline" {
		if err := mkdirOpen(source); err != nil {
			return nil, status.Errorf(codes.Internal, "creating %s: %v", source, err)
		}
		if err := writeKV(filepath.Join(source, ".volume-context"), req.GetVolumeContext()); err != nil {
			return nil, status.Errorf(codes.Internal, "writing the volume context: %v", err)
		}
	} else if _, err := os.Stat(source); err != nil {
		return nil, status.Errorf(codes.NotFound, "volume %s: %v", req.GetVolumeId(), err)
	}
	if isMountPoint(target) {
		return &csi.NodePublishVolumeResponse{}, nil
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "creating %s: %v", target, err)
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return nil, status.Errorf(codes.Internal, "bind-mounting %s at %s: %v", source, target, err)
	}
	if req.GetReadonly() {
		if err := unix.Mount("", target, "", unix.MS_BIND|unix.MS_REMOUNT|unix.MS_RDONLY, ""); err != nil {
			_ = unix.Unmount(target, 0)
			return nil, status.Errorf(codes.Internal, "making %s read-only: %v", target, err)
		}
	}
	if d.published[req.GetVolumeId()] == nil {
		d.published[req.GetVolumeId()] = map[string]bool{}
	}
	d.published[req.GetVolumeId()][target] = true
	log.Printf("NodePublishVolume %s (%s, readonly=%v) at %s", req.GetVolumeId(), kind, req.GetReadonly(), target)
	return &csi.NodePublishVolumeResponse{}, nil
}

func (d *driver) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	target := req.GetTargetPath()
	if isMountPoint(target) {
		if err := unix.Unmount(target, 0); err != nil {
			return nil, status.Errorf(codes.Internal, "unmounting %s: %v", target, err)
		}
	}
	if err := os.Remove(target); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, status.Errorf(codes.Internal, "removing %s: %v", target, err)
	}
	delete(d.published[req.GetVolumeId()], target)
	if len(d.published[req.GetVolumeId()]) == 0 {
		delete(d.published, req.GetVolumeId())
	}
	// An inline volume lives as long as its one publication.
	if inline, err := d.dir("inline", req.GetVolumeId()); err == nil {
		_ = os.RemoveAll(inline)
	}
	log.Printf("NodeUnpublishVolume %s at %s", req.GetVolumeId(), target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

// --- the kubelet's plugin registration ---

func (d *driver) GetInfo(context.Context, *registration.InfoRequest) (*registration.PluginInfo, error) {
	return &registration.PluginInfo{
		Type: registration.CSIPlugin, Name: d.name, Endpoint: d.csiSocket, SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (d *driver) NotifyRegistrationStatus(_ context.Context, s *registration.RegistrationStatus) (*registration.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		log.Printf("the kubelet refused the registration: %s", s.Error)
	} else {
		log.Printf("registered with the kubelet")
	}
	return &registration.RegistrationStatusResponse{}, nil
}

func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}

func main() {
	d := &driver{published: map[string]map[string]bool{}}
	var registrationDir string
	flag.StringVar(&d.name, "name", "csi.evi.test", "the driver's name")
	flag.StringVar(&d.nodeID, "node-id", "", "the node's name")
	flag.StringVar(&d.dataDir, "data-dir", "", "where the volumes' directories are made")
	flag.StringVar(&d.csiSocket, "csi-socket", "", "the CSI endpoint (a unix socket path)")
	flag.StringVar(&registrationDir, "registration-dir", "", "the kubelet's plugins_registry directory; empty: do not register (controller only)")
	flag.Parse()
	if d.nodeID == "" || d.dataDir == "" || d.csiSocket == "" {
		log.Fatal("--node-id, --data-dir and --csi-socket are required")
	}
	for _, kind := range []string{"volumes", "inline"} {
		if err := mkdirOpen(filepath.Join(d.dataDir, kind)); err != nil {
			log.Fatal(err)
		}
	}
	var servers []*grpc.Server
	csiListener, err := listen(d.csiSocket)
	if err != nil {
		log.Fatalf("listening on %s: %v", d.csiSocket, err)
	}
	csiServer := grpc.NewServer()
	csi.RegisterIdentityServer(csiServer, d)
	csi.RegisterControllerServer(csiServer, d)
	csi.RegisterNodeServer(csiServer, d)
	servers = append(servers, csiServer)
	go func() { _ = csiServer.Serve(csiListener) }()
	if registrationDir != "" {
		regSocket := filepath.Join(registrationDir, d.name+"-reg.sock")
		regListener, err := listen(regSocket)
		if err != nil {
			log.Fatalf("listening on %s: %v", regSocket, err)
		}
		regServer := grpc.NewServer()
		registration.RegisterRegistrationServer(regServer, d)
		servers = append(servers, regServer)
		go func() { _ = regServer.Serve(regListener) }()
		defer os.Remove(regSocket)
	}
	log.Printf("%s serving on %s", d.name, d.csiSocket)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
	for _, s := range servers {
		s.Stop()
	}
	_ = os.Remove(d.csiSocket)
}
