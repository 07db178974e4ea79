"""The metadata service's dashboard: a static page (page.html, no build step, nothing fetched from
elsewhere) that polls /dashboard/data on the admin port; routes.py mounts both."""
