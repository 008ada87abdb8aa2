// Command evi-cert-manager runs cert-manager's own controllers for the end-to-end tests: the
// certificate controllers, the self-signed and CA issuers, the approver, and the CA injector,
// all from cert-manager's published module (github.com/cert-manager/cert-manager), wired as its
// controller and cainjector binaries wire them. Those binaries' main packages live in nested
// modules that the Go module proxy does not serve, so this is their wiring, for the parts the
// chart's tls.mode=certManager uses; the controllers' code is cert-manager's, unchanged.
//
//	evi-cert-manager --kubeconfig FILE [--cluster-resource-namespace NS]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"

	cmscheme "github.com/cert-manager/cert-manager/pkg/api"
	"github.com/cert-manager/cert-manager/pkg/controller"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
	"github.com/cert-manager/cert-manager/pkg/util"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	kscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	// Each controller registers itself with controller.Known() when imported, and each
	// issuer type with the issuer factory.
	"github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	crca "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	crselfsigned "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	"github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	"github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

var controllers = []string{
	issuers.ControllerName,
	trigger.ControllerName, keymanager.ControllerName, requestmanager.ControllerName,
	issuing.ControllerName, readiness.ControllerName, revisionmanager.ControllerName,
	approver.ControllerName, crca.CRControllerName, crselfsigned.CRControllerName,
}

func main() {
	// A flag set of its own: controller-runtime registers --kubeconfig on the global one.
	flags := flag.NewFlagSet("evi-cert-manager", flag.ExitOnError)
	kubeconfig := flags.String("kubeconfig", "", "the API server's kubeconfig")
	resourceNS := flags.String("cluster-resource-namespace", "cert-manager", "ClusterIssuers' Secrets' namespace")
	_ = flags.Parse(os.Args[1:])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx = logf.NewContext(ctx, logf.Log, "evi-cert-manager")
	ctrl.SetLogger(logf.Log)
	if err := run(ctx, *kubeconfig, *resourceNS); err != nil {
		fmt.Fprintln(os.Stderr, "evi-cert-manager:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, kubeconfig, resourceNS string) error {
	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig: kubeconfig, KubernetesAPIQPS: 50, KubernetesAPIBurst: 100,
		IssuerOptions: controller.IssuerOptions{ClusterResourceNamespace: resourceNS},
		CertificateOptions: controller.CertificateOptions{
			CertificateRequestMinimumBackoffDuration: 1e9, CertificateRequestMaximumBackoffDuration: 10e9,
		},
	})
	if err != nil {
		return err
	}
	var wg sync.WaitGroup
	errs := make(chan error, len(controllers)+1)
	for _, name := range controllers {
		construct, ok := controller.Known()[name]
		if !ok {
			return fmt.Errorf("controller %s is not registered", name)
		}
		c, err := construct(factory)
		if err != nil {
			return fmt.Errorf("controller %s: %w", name, err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.Run(2, ctx); err != nil {
				errs <- fmt.Errorf("controller %s: %w", name, err)
			}
		}()
	}
	shared, err := factory.Build()
	if err != nil {
		return err
	}
	shared.KubeSharedInformerFactory.Start(ctx.Done())
	shared.SharedInformerFactory.Start(ctx.Done())
	shared.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())

	// The CA injector: a controller-runtime manager with cert-manager's injectors for the two
	// webhook configuration kinds (the chart's cert-manager.io/inject-ca-from annotation).
	restConfig, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	// Its field manager is taken from the user agent, as in cert-manager's cainjector.
	restConfig = util.RestConfigWithUserAgent(restConfig, "cainjector")
	// The injector reads Certificates (cert-manager.io/inject-ca-from): its client needs
	// cert-manager's types beside Kubernetes' own, as cert-manager's cainjector registers them.
	scheme := runtime.NewScheme()
	utilruntime.Must(kscheme.AddToScheme(scheme))
	utilruntime.Must(cmscheme.AddToScheme(scheme))
	mgr, err := ctrl.NewManager(restConfig, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	if err != nil {
		return err
	}
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			cainjector.MutatingWebhookConfigurationName:   true,
			cainjector.ValidatingWebhookConfigurationName: true,
		},
	}); err != nil {
		return err
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := mgr.Start(ctx); err != nil {
			errs <- fmt.Errorf("cainjector: %w", err)
		}
	}()
	fmt.Fprintln(os.Stderr, "evi-cert-manager: controllers and CA injector running")
	select {
	case err := <-errs:
		return err
	case <-ctx.Done():
	}
	wg.Wait()
	return nil
}
